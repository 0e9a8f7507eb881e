// Bucket assignment edge cases: order, caps, oversize parameters, mixed dtypes, empty models.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "dist/bucketing.h"

using namespace minidl;
using namespace minidl::dist;

static void expect_partition(const std::vector<BucketSpec>& buckets, const std::vector<ParamSpec>& params) {
  std::set<size_t> seen;
  for (const BucketSpec& b : buckets) {
    int64_t off = 0;
    ASSERT_EQ(b.params.size(), b.offsets.size());
    for (size_t s = 0; s < b.params.size(); ++s) {
      EXPECT_TRUE(seen.insert(b.params[s]).second) << "parameter " << b.params[s] << " in two buckets";
      EXPECT_EQ(b.offsets[s], off);
      EXPECT_EQ(params[b.params[s]].dtype, b.dtype);
      off += params[b.params[s]].numel;
    }
    EXPECT_EQ(b.numel, off);
  }
  EXPECT_EQ(seen.size(), params.size());
}

TEST(Bucketing, ReverseRegistrationOrderAndCaps) {
  // 10 f32 parameters of 100 elements (400 bytes); first cap 1000 bytes, then 2000.
  std::vector<ParamSpec> params(10, ParamSpec{100, DType::f32});
  auto b = assign_buckets(params, {.bucket_cap_bytes = 2000, .first_bucket_cap_bytes = 1000});
  expect_partition(b, params);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{9, 8, 7}));        // 1200 bytes >= 1000 closes the first bucket
  EXPECT_EQ(b[1].params, (std::vector<size_t>{6, 5, 4, 3, 2}));  // 2000 bytes
  EXPECT_EQ(b[2].params, (std::vector<size_t>{1, 0}));           // what is left
}

TEST(Bucketing, ParameterLargerThanTheCapGetsItsOwnBucket) {
  std::vector<ParamSpec> params{{10, DType::f32}, {1 << 20, DType::f32}, {10, DType::f32}};
  auto b = assign_buckets(params, {.bucket_cap_bytes = 4096, .first_bucket_cap_bytes = 1024});
  expect_partition(b, params);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{2, 1}));  // the big one closes the bucket it lands in
  EXPECT_EQ(b[1].params, (std::vector<size_t>{0}));
}

TEST(Bucketing, MixedDtypesNeverShareABucket) {
  std::vector<ParamSpec> params{{8, DType::f32}, {8, DType::bf16}, {8, DType::f32}, {8, DType::bf16}};
  auto b = assign_buckets(params);
  expect_partition(b, params);
  ASSERT_EQ(b.size(), 2u);
  for (const BucketSpec& s : b) EXPECT_EQ(s.params.size(), 2u);
  EXPECT_EQ(b[0].params[0], 3u);  // the bucket holding the last-registered parameter comes first
}

TEST(Bucketing, EmptyModelAndDefaults) {
  EXPECT_TRUE(assign_buckets({}).empty());
  EXPECT_EQ(kDefaultBucketCapBytes, size_t(25) << 20);
  EXPECT_EQ(kDefaultFirstBucketCapBytes, size_t(1) << 20);
  std::vector<ParamSpec> zero{{0, DType::f32}};
  auto b = assign_buckets(zero);
  expect_partition(b, zero);
  EXPECT_THROW(assign_buckets(zero, {.bucket_cap_bytes = 0}), Error);
}
