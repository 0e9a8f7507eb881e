#include "dist/bucketing.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace minidl::dist {

std::vector<BucketSpec> assign_buckets(const std::vector<ParamSpec>& params, const BucketCaps& caps) {
  MINIDL_CHECK(caps.bucket_cap_bytes > 0 && caps.first_bucket_cap_bytes > 0,
               "assign_buckets: bucket caps must be positive, got ", caps.bucket_cap_bytes, " and ",
               caps.first_bucket_cap_bytes);
  std::vector<BucketSpec> done;
  std::map<DType, BucketSpec> open;  // one bucket being filled per dtype
  auto cap_for = [&](DType dt) {
    // The first bucket of each dtype is the small one.
    for (const BucketSpec& b : done)
      if (b.dtype == dt) return caps.bucket_cap_bytes;
    return caps.first_bucket_cap_bytes;
  };
  for (size_t k = params.size(); k-- > 0;) {
    const ParamSpec& p = params[k];
    MINIDL_CHECK(p.numel >= 0, "assign_buckets: parameter ", k, " has ", p.numel, " elements");
    auto [it, inserted] = open.try_emplace(p.dtype, BucketSpec{p.dtype, {}, {}, 0});
    BucketSpec& b = it->second;
    b.params.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel;
    if (size_t(b.numel) * dtype_size(p.dtype) >= cap_for(p.dtype)) {
      done.push_back(std::move(b));
      open.erase(it);
    }
  }
  // Partly filled buckets close at the end, in the order their first parameter arrived.
  std::vector<BucketSpec> rest;
  for (auto& [dt, b] : open) rest.push_back(std::move(b));
  std::sort(rest.begin(), rest.end(),
            [](const BucketSpec& a, const BucketSpec& b) { return a.params[0] > b.params[0]; });
  for (BucketSpec& b : rest) done.push_back(std::move(b));
  return done;
}

}  // namespace minidl::dist
