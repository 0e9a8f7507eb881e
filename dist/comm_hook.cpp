#include "dist/comm_hook.h"

#include "core/memory.h"
#include "dist/reduce.h"

namespace minidl::dist {

Compression compression(const std::string& name) {
  if (name == "none") return Compression::kNone;
  if (name == "bf16") return Compression::kBf16;
  if (name == "fp16") return Compression::kFp16;
  MINIDL_CHECK(false, "communication hook '", name, "': expected none, bf16 or fp16");
  return Compression::kNone;
}

const char* compression_name(Compression c) {
  return c == Compression::kNone ? "none" : c == Compression::kBf16 ? "bf16" : "fp16";
}

std::shared_ptr<Work> average(ProcessGroup& group, Tensor& buffer, Compression c) {
  if (c == Compression::kNone || group.size() == 1) return group.all_reduce(buffer, ReduceOp::kAvg);
  MINIDL_CHECK(buffer.dtype() == DType::f32, "average: a ", compression_name(c), " hook compresses f32, got ",
               dtype_name(buffer.dtype()));
  divide_by(buffer, group.size());  // x / N: the 16-bit sum stays in the inputs' range
  Tensor wire;
  {
    MemoryTagGuard tag(MemTag::kComm);
    wire = Tensor::empty(buffer.shape(), c == Compression::kBf16 ? DType::bf16 : DType::f16, buffer.device());
  }
  convert_into(wire, buffer);
  group.all_reduce_16bit(wire, ReduceOp::kSum)->wait();
  convert_into(buffer, wire);
  return completed_work();
}

}  // namespace minidl::dist
