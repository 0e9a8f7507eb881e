// The overlap of bucketed gradient collectives with backward (predict/overlap.h), on schedules computed by hand.
#include <gtest/gtest.h>

#include "predict/overlap.h"

namespace minidl::predict {
namespace {

TEST(PredictOverlap, TwoBucketsTheSecondReadyAtTheEndOfBackward) {
  // Backward ends at 4. Bucket 0 is ready at 2 and takes 3 (runs 2-5); bucket 1 is ready at 4 but waits for the
  // stream until 5 and takes 1 (runs 5-6): 6 - 4 = 2 exposed of 4 in all.
  const OverlapResult r = overlap_buckets({{2, 3}, {4, 1}}, 4);
  EXPECT_DOUBLE_EQ(r.comm_total, 4);
  EXPECT_DOUBLE_EQ(r.comm_end, 6);
  EXPECT_DOUBLE_EQ(r.exposed, 2);
}

TEST(PredictOverlap, HiddenCommunicationCostsNothingButTheLastBucket) {
  // Bucket 0 (ready 1, cost 1) ends at 2, long before backward's end at 4; the last bucket, ready at 4, is all
  // exposed: 0.5.
  EXPECT_DOUBLE_EQ(overlap_buckets({{1, 1}, {4, 0.5}}, 4).exposed, 0.5);
  EXPECT_DOUBLE_EQ(overlap_buckets({{1, 1}, {2, 0.5}}, 4).exposed, 0.0);
}

TEST(PredictOverlap, BucketsAreDdpsReverseOrderWithTheSmallFirstBucket) {
  // Units in registration order: a (400,000 f32 = 1.6 MB), b (100,000), c (200,000). Reverse order: c (0.8 MB,
  // under the 1 MiB first cap), then b closes the first bucket {c, b} at 1.2 MB; a is the second bucket.
  const std::vector<GradUnit> units{{400000, 9.0}, {100000, 5.0}, {200000, 2.0}};
  const std::vector<Bucket> buckets = gradient_buckets(units);
  ASSERT_EQ(buckets.size(), 2u);
  EXPECT_EQ(buckets[0].numel, 300000);
  EXPECT_DOUBLE_EQ(buckets[0].ready, 5.0);  // when b, its last unit, is ready
  EXPECT_EQ(buckets[1].numel, 400000);
  EXPECT_DOUBLE_EQ(buckets[1].ready, 9.0);
}

}  // namespace
}  // namespace minidl::predict
