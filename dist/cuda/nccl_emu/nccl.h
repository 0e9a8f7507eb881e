// The subset of NCCL's nccl.h that minidl uses, for the emulated CUDA build (minidl_cuda_backend_emu), where there
// is no NCCL runtime and "device" memory is host memory. Library minidl_nccl_emu implements it with MPI; its
// include directory comes before the toolkit's, so dist/cuda/ includes <nccl.h> in both builds and gets the real
// header under nvcc's toolchain and this one here. Names, values and signatures are NCCL 2.28's.
//
// What differs from NCCL (nccl_emu.cpp explains how it works):
// - Every call runs to completion on the host before it returns with synchronous emulated streams (the default);
//   with deferred streams (MINIDL_EMU_STREAMS=async, cuda_emu/emulator.h) it is queued on its stream and runs in
//   stream order. Between ncclGroupStart and ncclGroupEnd, sends and receives are collected and posted together
//   by ncclGroupEnd, as one operation on the stream of the first.
// - Reductions: ncclSum, ncclProd, ncclMax, ncclMin on every type but f16/bf16 (minidl reduces those in f32);
//   ncclAvg is not provided. Other calls return ncclInvalidArgument.
// - ncclCommInitRank: the process that called ncclGetUniqueId must be one of the communicator's ranks.
#pragma once

#include <cuda_runtime.h>
#include <limits.h>
#include <stddef.h>

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_VERSION_CODE 22809

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4, ncclNumOps = 5 } ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
// Not NCCL's: how many communicators ncclCommInitRank has made in this process (tests check that a group of one
// makes none).
int minidl_nccl_emu_communicators_created();
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
// The communicator's asynchronous error (ncclSuccess while there is none). The emulator raises one for tests:
// MINIDL_NCCL_EMU_ASYNC_ERROR=N makes the N-th operation of the process (on any communicator) leave
// ncclRemoteError on its communicator, as a peer that died or a broken link would.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
const char* ncclGetErrorString(ncclResult_t result);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}  // extern "C"
#endif
