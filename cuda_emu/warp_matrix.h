// warp_matrix.h — the emulator's versions of the tensor-core instructions minidl's kernels use (included by
// emulator.h). Kernels call them through cuda_emu/tensor_core.h, which is inline PTX under nvcc.
//
//   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32   a warp collective: every lane deposits its
//       fragments (the PTX ISA's layouts, see tensor_core.h), the last lane to arrive computes D = A B + C in f32
//       for the whole warp and hands each lane its part.
//   ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16           a warp collective: lanes 8m..8m+7 give the
//       row addresses of matrix m; each lane receives its two elements of each matrix.
//   cp.async.cg.shared.global (16 bytes), commit_group, wait_group N   a deferred copy per emulated thread: at
//       issue the destination is filled with 0xFF bytes (NaN in f32, f16 and bf16) and the source is read; the
//       bytes land when a wait_group completes the copy's group. A kernel that reads before waiting (or waits in
//       one thread and lets another read without a barrier) reads poison. Copies never waited for never land.
#pragma once

#include <cstdint>
#include <source_location>

namespace minidl::emu::detail {

enum class MmaInput : uint8_t { kF16, kBF16 };

// d, c: 4 floats; a: 4 registers; b: 2 registers (each register two 16-bit values, the lower index in the low half).
// d may alias c. Every lane of the warp must call it (the instruction is .aligned).
void mma_m16n8k16(MmaInput type, float* d, const uint32_t* a, const uint32_t* b, const float* c,
                  const std::source_location& site);

// matrices: 1, 2 or 4; row: this lane's row address (16 bytes, 16-byte aligned), read when the last lane arrives.
void ldmatrix(int matrices, bool trans, uint32_t* regs, const void* row, const std::source_location& site);

void cp_async(void* dst, const void* src, int bytes, const std::source_location& site);
void cp_async_commit();
// Lands every copy of the calling thread's committed groups but the newest `pending` ones.
void cp_async_wait(int pending);

}  // namespace minidl::emu::detail
