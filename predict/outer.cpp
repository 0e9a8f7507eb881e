#include "predict/outer.h"

#include <algorithm>

#include "predict/collectives.h"

namespace minidl::predict {

double host_passes(double passes, double params, const Machine& m) {
  return passes * 4 * params / (m.mem_bw * m.eff.elementwise);
}

double outer_sync_seconds(double params, int replicas, bool diloco, const Link& link, const Machine& m) {
  return all_reduce(replicas, 4 * params, link) + host_passes(diloco ? 24 : 16, params, m);
}

PsExchange ps_exchange(double params, int workers, int servers, bool sync, double worker_compute, double adamw,
                       const Link& link, const Machine& m) {
  const double shard = params / servers, W = workers;
  const double worker = host_passes(14, params, m);
  const double push = point_to_point(4 * shard, link) + host_passes(2, shard, m);
  const double reply = host_passes(2, shard, m) + point_to_point(4 * shard, link);
  const double update = host_passes(12, shard, m);  // AdamW itself apart
  PsExchange out;
  out.optimizer = adamw;
  if (sync) {
    const double sum = host_passes(3 * (W - 1) + 2, shard, m);
    out.exchange = worker + W * push + sum + update + W * reply;
  } else {
    const double answer = push + host_passes(2, shard, m) + update + adamw + reply;
    const double step = std::max(worker_compute + worker + answer, W * answer);
    out.exchange = step - worker_compute - adamw;
  }
  return out;
}

}  // namespace minidl::predict
