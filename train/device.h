// Devices and machine measurements for training programs: the --device flag, a GPU's name and peak (the MFU
// denominator), whether the CUDA backend is the emulator, and the process's peak memory.
#pragma once

#include <string>

#include "core/device.h"
#include "core/dtype.h"

namespace minidl::train {

// The device a program's --device flag names: "cpu", "cuda" (device `local_rank`, one GPU per rank on a host)
// or "cuda:N". For a CUDA device it asks the CUDA backend this program links (it registers itself: minidl_device,
// the real one or the emulated one in a -DMINIDL_CUDA_EMULATION=ON build; core/device_backend.h) whether the device
// exists; a program without one, or a machine without the device, is a clear error. The training layer itself
// never links a device runtime: a CPU-only program that uses the Trainer links no CUDA.
Device select_device(const std::string& flag, int local_rank = 0);
// The name of a CUDA device ("NVIDIA H100 80GB HBM3"), or "cpu".
std::string device_name(Device device);
// Dense peak TFLOP/s of a GPU, by name, for the dtype its matrix products run in (bf16/f16 tensor cores; f32 as
// TF32 tensor cores when tf32, otherwise plain FP32): the denominator of MFU. 0 when the GPU is not in the table.
double gpu_peak_tflops(const std::string& name, DType dtype, bool tf32);

// Whether this program's CUDA backend is the CPU emulator of CUDA (a -DMINIDL_CUDA_EMULATION=ON build).
bool cuda_is_emulated();

// Peak resident set size of this process in MiB (/proc/self/status VmHWM).
double peak_rss_mb();

}  // namespace minidl::train
