// Communication hooks: what a gradient (or pseudo-gradient) average sends. DDP's buckets (DDPOptions::compression,
// --comm-hook) and DiLoCo's outer all-reduce (OuterOptions::compression, --outer-comm-hook) go through average().
//
//   dist::average(group, bucket, dist::Compression::kBf16)->wait();   // bucket = mean over ranks, 16-bit on the wire
//
//   none       f32 all-reduce (ReduceOp::kAvg): 4 bytes an element.
//   bf16/fp16  x / N rounded to 16 bits, summed in 16 bits on the wire (ProcessGroup::all_reduce_16bit), widened
//              back: 2 bytes an element, exactly half (PyTorch's bf16_compress_hook and fp16_compress_hook).
//
// Why divide first: mean = Σ_r (x_r / N), and |Σ_r x_r / N| ≤ max_r |x_r|, so the 16-bit partial sums stay in the
// range of the inputs (fp16's largest finite value is 65504; a sum of N gradients could leave it).
//
// What it costs in accuracy: each x_r / N is rounded once (relative error ≤ 2^-9 for bf16's 8-bit significand,
// 2^-12 for fp16's 11), and each of the N − 1 hops that add a rank's share rounds its partial sum again, so the mean
// is off by at most about N · u · max |partial sum| (u = that unit roundoff). Gradients are noisy to far more than
// that; OpenDiLoCo reports fp16 pseudo-gradients lossless. bf16 keeps f32's range (no overflow, no scaling); fp16
// has 3 more bits but underflows below 6e-8 (values that small are flushed to subnormals, then zero).
#pragma once

#include <memory>
#include <string>

#include "core/tensor.h"
#include "dist/process_group.h"

namespace minidl::dist {

enum class Compression { kNone, kBf16, kFp16 };

// "none", "bf16" or "fp16"; throws naming the accepted ones otherwise.
Compression compression(const std::string& name);
const char* compression_name(Compression c);

// `buffer` (contiguous f32 on the group's device) = its mean over the group's ranks, sent as `c` says. kNone returns
// all_reduce's Work; the 16-bit hooks finish before they return (the widening needs the sum) and use a 16-bit
// temporary of the buffer's size.
std::shared_ptr<Work> average(ProcessGroup& group, Tensor& buffer, Compression c);

}  // namespace minidl::dist
