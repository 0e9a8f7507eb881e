#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/schedule.h"

using namespace minidl;

TEST(CosineSchedule, WarmupIsLinearAndReachesLr) {
  optim::CosineSchedule s(1.0, 0.1, 4, 20);
  EXPECT_DOUBLE_EQ(s(0), 0.25);
  EXPECT_DOUBLE_EQ(s(1), 0.5);
  EXPECT_DOUBLE_EQ(s(2), 0.75);
  EXPECT_DOUBLE_EQ(s(3), 1.0);
  EXPECT_DOUBLE_EQ(s(4), 1.0);  // cosine starts at lr
}

TEST(CosineSchedule, DecaysMonotonicallyToMinLr) {
  optim::CosineSchedule s(1.0, 0.1, 4, 20);
  for (int64_t step = 5; step < 20; ++step) EXPECT_LT(s(step), s(step - 1)) << "step " << step;
  EXPECT_DOUBLE_EQ(s(12), 0.55);  // halfway through the decay: midway between lr and min_lr
  EXPECT_NEAR(s(19), 0.1, 0.01);  // last step: just above min_lr
  EXPECT_GT(s(19), 0.1);
  EXPECT_DOUBLE_EQ(s(20), 0.1);  // past the end: min_lr
  EXPECT_DOUBLE_EQ(s(1000), 0.1);
}

TEST(CosineSchedule, NoWarmupStartsAtLr) {
  optim::CosineSchedule s(2.0, 0.0, 0, 10);
  EXPECT_DOUBLE_EQ(s(0), 2.0);
  EXPECT_DOUBLE_EQ(s(5), 1.0);
}

TEST(CosineSchedule, Constant) {
  auto s = optim::CosineSchedule::constant(3e-4);
  for (int64_t step : {0, 1, 7, 100000}) EXPECT_DOUBLE_EQ(s(step), 3e-4);
  optim::CosineSchedule same(3e-4, 3e-4, 0, 50);
  for (int64_t step = 0; step < 60; ++step) EXPECT_DOUBLE_EQ(same(step), 3e-4);
}

TEST(CosineSchedule, Errors) {
  EXPECT_THROW(optim::CosineSchedule(1.0, 2.0, 0, 10), Error);   // min_lr > lr
  EXPECT_THROW(optim::CosineSchedule(1.0, 0.1, 11, 10), Error);  // warmup > total
  EXPECT_THROW(optim::CosineSchedule(1.0, 0.1, 0, 0), Error);
  EXPECT_THROW(optim::CosineSchedule::constant(1.0)(-1), Error);
}
