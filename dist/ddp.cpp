#include "dist/ddp.h"

namespace minidl::dist {

namespace {

BucketCollective collective(const DDPOptions& o) {
  if (o.powersgd)
    return [h = o.powersgd](ProcessGroup& g, size_t b, Tensor& bucket) { return h->reduce(g, b, bucket); };
  return [c = o.compression](ProcessGroup& g, size_t, Tensor& bucket) { return average(g, bucket, c); };
}

ReducerOptions reducer_options(const DDPOptions& o) {
  ReducerOptions r;
  r.caps = o.caps;
  r.allow_unused_parameters = o.allow_unused_parameters;
  r.buckets = o.buckets;
  return r;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(nn::Module& module, ProcessGroup& group, DDPOptions options)
    : DistributedDataParallel(module.named_parameters(), group, options) {
  if (options.broadcast_at_start)
    for (auto& [name, t] : module.named_buffers()) group.broadcast(t, 0)->wait();
}

DistributedDataParallel::DistributedDataParallel(const std::vector<std::pair<std::string, Tensor>>& params,
                                                 ProcessGroup& group, DDPOptions options)
    : reducer_(params, group, collective(options), reducer_options(options)) {
  if (options.powersgd) options.powersgd->bind(reducer_.buckets(), reducer_.params());
  // Every rank starts from rank 0's weights, whatever its own initialisation was.
  if (options.broadcast_at_start)
    for (auto [name, p] : params) group.broadcast(p, 0)->wait();
}

}  // namespace minidl::dist
