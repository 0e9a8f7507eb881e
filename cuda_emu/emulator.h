// emulator.h — CUDA C++ for the host compiler: what a kernel sees when cuda_compat.h is built without nvcc.
// Include cuda_compat.h, not this file. Link minidl_cuda_emu and NOT libcudart (it defines the same symbols).
// It lives at the repository root rather than in core/ because it is its own library below ops/: it depends on
// nothing in minidl, and only emulated CUDA code and its tests link it, while every build links core/.
//
// Why it exists: no machine that builds or tests minidl has a GPU, yet every kernel must be executed by the
// tests. This is a model of CUDA's execution semantics for correctness, not speed (design:
// shared/docs/cuda-on-cpu.md). Types and enums are the toolkit's own: <cuda_runtime.h> (dim3, cudaError_t,
// cudaDeviceProp, the C++ cudaMalloc<T> wrappers), <cuda_fp16.h> and <cuda_bf16.h> all compile as host code;
// only their device-only intrinsics are re-implemented in intrinsics.h.
//
// The model:
//   - Blocks run in parallel on a pool of worker OS threads (MINIDL_EMU_WORKERS, default: hardware threads)
//     taking block indices from an atomic counter; a grid runs to completion before the next starts.
//   - The threads of a block are cooperative fibers on one worker (boost.context fcontext: a switch saves a few
//     registers and swaps stacks, no system call). A fiber runs until it reaches __syncthreads*, a warp
//     collective, or returns.
//   - threadIdx/blockIdx/blockDim/gridDim are thread_local globals the scheduler sets before switching into a
//     fiber (globals, not macros, so members with those names elsewhere keep working).
//   - Shared memory is filled with 0xFF bytes (NaN for f32/f16/bf16) for each block, so reading what no thread
//     of this block wrote shows up. Dynamic shared memory (dynamic_smem<T>()) is one buffer per worker, filled
//     at block start. Static shared memory is declared with MINIDL_SHARED(T, name, [dims]) (cuda_compat.h):
//     each declaration site has its own buffer per worker, which the first thread of a block to reach the
//     declaration fills (nothing can read it before) and counts towards the block's total, checked against
//     48 KiB static and, with the dynamic part, the kernel's limit (the process aborts with the site). Only
//     declarations the block reaches count, where nvcc counts every one.
//   - A raw __shared__ is `thread_local` so third-party code compiles: one copy per worker, and a worker runs
//     one block at a time (inside a function thread_local is implicitly static, so `static __shared__` works
//     too). Limits: it is NOT poisoned (it starts at zero on each worker and keeps the previous block's
//     values; a macro placed before the declaration cannot learn its address), it counts towards every OS
//     thread's static TLS, and its size is not checked. minidl's kernels must not use it
//     (tests/cuda_emu/test_sources.cpp).
//   - Barriers count arrivals: the last thread to arrive releases the others. Warp collectives: each lane
//     deposits its value and sets its bit; the last lane of the mask computes every lane's result; reading a
//     lane that does not take part yields all-one bits.
//   - Strict mode (default; MINIDL_EMU_STRICT=0 turns it off) aborts with the source lines when threads of a
//     block wait at different __syncthreads, or the lanes of a collective disagree on op or mask. A thread that
//     returned never arrives at a barrier or collective, so waiting for it is reported as a deadlock. Without
//     strict mode, returned threads count as arrived and barrier call sites are not compared.
//   - A scheduling pass in which no fiber can run while some are alive is a deadlock: the process aborts with
//     each range of threads, its state and its source line.
//   - Checkers (check.h, on by default): initcheck, memcheck and racecheck report a kernel reading unwritten
//     memory, accessing out of bounds or freed memory, or racing between threads of a block, like compute-sanitizer.
//   - MINIDL_EMU_ORDER=forward|reverse|random (seed MINIDL_EMU_SEED) picks the order in which a pass runs the
//     fibers, so a missing barrier (reader before writer) is caught in some order.
//   - Streams, MINIDL_EMU_STREAMS=sync|async (Options::streams). sync (the default): every stream operation runs
//     inside its call, so streams and events order nothing and a missing cudaStreamWaitEvent cannot fail. async,
//     "deferred streams" (streams.cpp): kernel launches (arguments copied), cudaMemcpyAsync, cudaMemsetAsync,
//     event records and waits, and library work through minidl::emu::enqueue (the emulated cuBLAS, NCCL, conv)
//     are queued on their stream and run only when the host waits: cudaStreamSynchronize/Query, cudaEvent-
//     Synchronize/Query (up to the event's record), cudaDeviceSynchronize, cudaMemcpy, cudaFree, cudaFreeHost. A
//     wait runs exactly the operations it needs, following event waits across streams, and runs the streams it is
//     not waiting on first (newest first): a consumer on another stream that forgot its wait reads the old data,
//     and a producer that nothing waits for never runs in time, every run. The legacy stream orders with blocking
//     streams as in CUDA (not with cudaStreamNonBlocking ones); a copy from pageable host memory takes its bytes
//     at the call, one into pageable memory returns once they landed. Queries never say cudaErrorNotReady (they
//     run the work), and a deferred operation's error is returned by the wait that ran it.
//
// __CUDA_ARCH__ is not defined (the toolkit's headers would take it for device compilation); code that must
// tell the emulated build apart tests MINIDL_CUDA_EMULATED.
//
// Not modelled: memory coalescing, bank conflicts, occupancy, timing, __activemask as a report of convergence
// (it returns every live lane of the warp), spin-waiting on memory that another thread of the same block
// writes (fibers switch only at barriers and collectives, so it hangs), dynamic parallelism, cooperative groups,
// inline PTX in general, tensor-core instructions other than those of warp_matrix.h (mma m16n8k16 f16/bf16,
// ldmatrix, cp.async.cg 16 bytes), wgmma, TMA, clusters, textures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define MINIDL_CUDA_EMULATED 1

// The toolkit's host_defines.h already turns __device__, __global__, __host__, __constant__ and __managed__
// into nothing and __forceinline__/__align__/__noinline__ into GCC attributes. These two it leaves out or
// defines for nvcc's meaning:
#undef __shared__
#define __shared__ thread_local
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif

#include "cuda_emu/check.h"
#include "cuda_emu/atomics.h"
#include "cuda_emu/device.h"
#include "cuda_emu/intrinsics.h"
#include "cuda_emu/launch.h"
#include "cuda_emu/warp_matrix.h"
