// MINIDL_HD marks math shared by the CPU and CUDA backends (__host__ __device__ under nvcc).
#pragma once
#if defined(__CUDACC__)
#define MINIDL_HD __host__ __device__ __forceinline__
#else
#define MINIDL_HD inline
#endif
