#include "core/dtype.h"

#include <string>

#include "core/error.h"

namespace minidl {

const DTypeInfo& dtype_info(DType dt) {
  static const DTypeInfo table[] = {
      {"f32", 4, "F32", true},  {"f64", 8, "F64", true},  {"f16", 2, "F16", true}, {"bf16", 2, "BF16", true},
      {"i32", 4, "I32", false}, {"i64", 8, "I64", false}, {"u8", 1, "U8", false},
  };
  return table[static_cast<int>(dt)];
}

DType dtype_from_safetensors(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(DType::u8); ++i) {
    DType dt = static_cast<DType>(i);
    if (s == dtype_info(dt).safetensors) return dt;
  }
  MINIDL_CHECK(false, "safetensors: unsupported dtype '", std::string(s),
               "', expected one of F32, F64, F16, BF16, I32, I64, U8");
  return DType::f32;
}

void throw_unsupported_dtype(const char* op, DType dt) {
  MINIDL_CHECK(false, op, ": expected a f32 or f64 tensor, got ", dt);
}

}  // namespace minidl
