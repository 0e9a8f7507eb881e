// dist's device kernels (kernels.h) on Tensors, for the CUDA backend library: the entries of dist/reduce.h's
// device tables (reduce_into, divide_by, convert_into) and the dtype mapping the NCCL backend shares.
#pragma once

#include "core/tensor.h"
#include "dist/cuda/kernels.h"

namespace minidl::dist {

// The kernels' element type of a reducible dtype (f32, f64, i32, i64, u8).
cuda_kernels::ElementType element_type(DType dtype);

// Fills reduce_into_device, divide_by_device and convert_into_device for CUDA devices.
void register_tensor_kernels();

}  // namespace minidl::dist
