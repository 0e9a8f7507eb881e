// Element types. One table (dtype.cpp) maps each to its size, its name and its safetensors string.
#pragma once

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string_view>

#include "core/half.h"

namespace minidl {

// f64 exists for float64 gradient checks; training runs in f32 (and f16/bf16 under autocast).
enum class DType : uint8_t { f32, f64, f16, bf16, i32, i64, u8 };

struct DTypeInfo {
  const char* name;         // "f32"
  size_t size;              // bytes per element
  const char* safetensors;  // "F32"
  bool is_floating;
};

const DTypeInfo& dtype_info(DType dt);
inline size_t dtype_size(DType dt) { return dtype_info(dt).size; }
inline const char* dtype_name(DType dt) { return dtype_info(dt).name; }
inline bool is_floating(DType dt) { return dtype_info(dt).is_floating; }
// Parses a safetensors dtype string ("F32", "BF16", ...); throws naming the string if unknown.
DType dtype_from_safetensors(std::string_view s);

inline std::ostream& operator<<(std::ostream& os, DType dt) { return os << dtype_name(dt); }

// C++ type <-> DType.
template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::f16;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::i64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::u8;
};

// Calls fn with a value of the C++ type for dt: dispatch_dtype(dt, [&](auto tag) { using T = decltype(tag); ... }).
template <class Fn>
decltype(auto) dispatch_dtype(DType dt, Fn&& fn) {
  switch (dt) {
    case DType::f32: return fn(float{});
    case DType::f64: return fn(double{});
    case DType::f16: return fn(f16{});
    case DType::bf16: return fn(bf16{});
    case DType::i32: return fn(int32_t{});
    case DType::i64: return fn(int64_t{});
    case DType::u8: return fn(uint8_t{});
  }
  return fn(float{});
}

// Same, for the two dtypes that float kernels are written for (f32, f64); anything else is an error naming `op`.
void throw_unsupported_dtype(const char* op, DType dt);
template <class Fn>
decltype(auto) dispatch_float(const char* op, DType dt, Fn&& fn) {
  if (dt == DType::f64) return fn(double{});
  if (dt != DType::f32) throw_unsupported_dtype(op, dt);
  return fn(float{});
}

// Load/store any element type as double or float (slow paths: casts, printing, tests).
template <class T>
inline double to_double(T v) {
  return double(v);
}
template <>
inline double to_double(f16 v) {
  return to_float(v);
}
template <>
inline double to_double(bf16 v) {
  return to_float(v);
}
template <class T>
inline T from_double(double v) {
  return T(v);
}
template <>
inline f16 from_double(double v) {
  return to_f16(float(v));
}
template <>
inline bf16 from_double(double v) {
  return to_bf16(float(v));
}

}  // namespace minidl
