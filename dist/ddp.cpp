#include "dist/ddp.h"

namespace minidl::dist {

namespace {

ReducerOptions reducer_options(const DDPOptions& o) {
  ReducerOptions r;
  r.caps = o.caps;
  r.allow_unused_parameters = o.allow_unused_parameters;
  r.buckets = o.buckets;
  return r;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, DDPOptions options)
    : module_(module),
      reducer_(module.named_parameters(), group,
               [](ProcessGroup& g, size_t, Tensor& bucket) { return g.all_reduce(bucket, ReduceOp::kAvg); },
               reducer_options(options)) {
  if (options.broadcast_at_start) {
    // Every rank starts from rank 0's weights (and buffers), whatever its own initialisation was.
    for (auto& [name, p] : module.named_parameters()) group.broadcast(p, 0)->wait();
    for (auto& [name, t] : module.named_buffers()) group.broadcast(t, 0)->wait();
  }
}

}  // namespace minidl::dist
