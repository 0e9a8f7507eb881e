#include "predict/overlap.h"

#include <algorithm>

#include "core/error.h"

namespace minidl::predict {

OverlapResult overlap_buckets(const std::vector<BucketTiming>& buckets, double backward_end) {
  OverlapResult out;
  double end = 0;
  for (const BucketTiming& b : buckets) {
    MINIDL_ASSERT(b.cost >= 0 && b.ready >= 0, "overlap_buckets: negative time");
    end = std::max(end, b.ready) + b.cost;
    out.comm_total += b.cost;
  }
  out.comm_end = end;
  out.exposed = std::max(0.0, end - backward_end);
  return out;
}

std::vector<Bucket> gradient_buckets(const std::vector<GradUnit>& units, const dist::BucketCaps& caps) {
  std::vector<dist::ParamSpec> params;
  for (const GradUnit& u : units) params.push_back({u.numel, DType::f32});
  std::vector<Bucket> out;
  for (const dist::BucketSpec& spec : dist::assign_buckets(params, caps)) {
    Bucket b{spec.numel, 0};
    for (size_t i : spec.params) b.ready = std::max(b.ready, units[i].ready);
    out.push_back(b);
  }
  // The communication stream takes buckets in the order they become ready.
  std::stable_sort(out.begin(), out.end(), [](const Bucket& a, const Bucket& b) { return a.ready < b.ready; });
  return out;
}

}  // namespace minidl::predict
