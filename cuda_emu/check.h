// check.h — the emulator as a sanitizer: what compute-sanitizer's initcheck, memcheck and racecheck find on a
// GPU, found on the CPU (included by emulator.h; internal hooks in scheduler.h).
//
// Why: the emulator is kinder than silicon. A device allocation comes back holding whatever the host heap had;
// a read past the end of a tensor lands in the caching allocator's padding, not on an unmapped page; threads of
// a block run one after another between barriers, so two of them touching one word give a fixed, plausible
// answer. With the checkers on, each of these ends the process with a report that reads like compute-sanitizer's.
//
// How: the kernels' translation units are compiled with GCC's ThreadSanitizer instrumentation but linked without
// its runtime (minidl_emu_instrument in CMakeLists.txt): every load and store becomes a call to __tsan_readN /
// __tsan_writeN with the address, and every atomic a call to __tsan_atomicN_op. check.cpp supplies those
// functions: outside a kernel a load or store returns at once (an atomic just does its operation); inside one it
// looks the address up. (AddressSanitizer's kernel mode was tried first: it checks a store after a load of the
// same address once, as a load, so the writes that racecheck and initcheck need go missing.)
//   - Global memory: every cudaMalloc gets a shadow byte per byte (no access / freed / unwritten / written) and a
//     256-byte red zone after it; freed allocations stay in quarantine (64 MiB) so a late access is "use after
//     free", not a hit in someone else's memory. The caching allocator (core/cuda/allocator.cpp) tells the
//     checker which bytes of its block a tensor asked for (note_block_allocated): the rounding padding is no
//     access, and a block back in the cache is freed.
//   - initcheck: a new allocation or block is filled with 0xFF bytes (NaN in f32, f16 and bf16) and is
//     unwritten; kernel stores, cudaMemcpy* and cudaMemset* mark bytes written. Host code standing in for
//     cuBLAS, cuDNN and NCCL writes device memory directly, so a read is reported only if every byte it reads
//     still holds the poison (a host write of a NaN with all bits set would be taken for no write: none of
//     them writes one). Shared memory (dynamic and MINIDL_SHARED) is unwritten at the start of each block.
//   - memcheck: an access to a red zone, to rounding padding or to freed memory is reported with the nearest
//     allocation and the offset.
//   - racecheck: within one barrier interval of a block, each byte of shared memory remembers its last writer
//     and its readers, each byte of global memory its last writer. A write and a read (or two writes) of one
//     byte by different threads are a hazard unless the two threads are the same warp and a warp collective
//     (__syncwarp, a shuffle, a vote, ldmatrix, mma) completed between them. Atomics are never hazards. Global
//     memory is checked for write-after-write and read-after-write (a read followed by another thread's write
//     is found in shared memory only).
//
// Each report names the kernel, the block and thread, the address, the allocation and offset, and the source
// line (addr2line on the kernel's line tables), and aborts: the test that caused it fails. The checkers see the
// accesses the compiler kept: racy code that is not volatile may be optimised into fewer of them.
//
// MINIDL_EMU_CHECK=all (default) | none | a comma list of initcheck, memcheck, racecheck selects the checkers
// at run time (Options::checks); -DMINIDL_EMU_CHECKS=OFF compiles the instrumentation out (a benchmark of the
// emulator, or the ASan/TSan builds, whose own instrumentation cannot be combined with it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace minidl::emu {

// Bits of Options::checks.
inline constexpr unsigned kInitcheck = 1, kMemcheck = 2, kRacecheck = 4, kAllChecks = 7;

// Whether the kernels of this build are instrumented (MINIDL_EMU_CHECKS).
bool checks_compiled();

// The caching allocator's hand-outs and returns: `bytes` of a block whose capacity (its cudaMalloc) is
// `capacity`, in the order of `stream` (work queued before a return may still use the block). `exact` false (a
// CUDA graph's private pool, whose captured kernels keep using a block after its tensor is freed) keeps the whole
// capacity addressable and never freed.
void note_block_allocated(const void* ptr, size_t bytes, size_t capacity, bool exact, cudaStream_t stream);
void note_block_released(const void* ptr, size_t capacity, bool exact, cudaStream_t stream);

}  // namespace minidl::emu
