// Helpers for the collective tests: rank-dependent integer-valued data, expected results computed locally, and
// the backends under test.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "dist/mpi_backend.h"
#include "dist/process_group.h"
#include "dist/ring_backend.h"
#include "support/mpi_test.h"

namespace minidl::testing {

inline const std::vector<DType> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                              DType::i32, DType::i64, DType::u8};

// Small non-negative integers: exact in every dtype (bf16 included), and sums over 4 ranks fit in a u8.
inline double pattern(int rank, int64_t i) { return double((i * 7 + rank * 5 + 3) % 17); }

inline Tensor pattern_tensor(int rank, int64_t numel, DType dtype, int64_t offset = 0) {
  std::vector<double> v(numel);
  for (int64_t i = 0; i < numel; ++i) v[i] = pattern(rank, offset + i);
  return Tensor::from_vector(v, {numel}, dtype);
}

// What element i of `op` over ranks 0..n-1 must be, rounded the way the contract says: f16/bf16 reduce in f32 and
// round once; kAvg divides the sum once, in the dtype (f32 for f16/bf16), integers truncating.
inline double expected_reduction(dist::ReduceOp op, int n, int64_t i, DType dtype) {
  double sum = 0, max = pattern(0, i);
  for (int r = 0; r < n; ++r) {
    sum += pattern(r, i);
    max = std::max(max, pattern(r, i));
  }
  if (op == dist::ReduceOp::kMax) return max;
  if (op == dist::ReduceOp::kSum) return sum;
  switch (dtype) {
    case DType::f64: return sum / n;
    case DType::f32: return double(float(sum) / float(n));
    case DType::f16: return double(to_float(to_f16(float(sum) / float(n))));
    case DType::bf16: return double(to_float(to_bf16(float(sum) / float(n))));
    default: return double(int64_t(sum) / n);
  }
}

// The configurations every collective is tested on: the MPI library, the ring with its default 512 KiB slices,
// and the ring with 256-byte slices so that small tensors already stream through many pipeline slices.
inline std::vector<std::string> backend_configs() { return {"mpi", "ring", "ring_small_slices"}; }

inline std::unique_ptr<dist::ProcessGroup> make_group(const std::string& config, MPI_Comm comm) {
  if (config == "ring_small_slices") return std::make_unique<dist::RingProcessGroup>(comm, dist::RingOptions{256});
  return dist::make_process_group(config, comm);
}

// Element counts for a world of n: empty, one, n-1, not divisible by n, several small slices, and (f32-sized,
// default slices only, to keep the suite quick) enough for three 512 KiB slices per chunk.
inline std::vector<int64_t> interesting_counts(int n, const std::string& config, DType dtype) {
  std::vector<int64_t> counts = {0, 1, n - 1, 7 * int64_t(n) + 1, 1000};
  bool f32_on_the_wire = dtype == DType::f32 || dtype == DType::f16;
  if (config != "ring_small_slices" && f32_on_the_wire) counts.push_back(3 * 131072 * int64_t(n) + 5);
  return counts;
}

}  // namespace minidl::testing
