#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"

using namespace minidl;

// Known-answer tests from Random123 (kat_vectors, philox4x32_10).
TEST(Philox, KnownAnswerZero) {
  uint4x r = Philox(0, 0).draw(0);
  EXPECT_EQ(r.x, 0x6627e8d5u);
  EXPECT_EQ(r.y, 0xe169c58du);
  EXPECT_EQ(r.z, 0xbc57ac4cu);
  EXPECT_EQ(r.w, 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerOnes) {
  // counter = key = all 0xffffffff
  uint4x r = Philox(~0ull, ~0ull).draw(~0ull);
  EXPECT_EQ(r.x, 0x408f276du);
  EXPECT_EQ(r.y, 0x41c83b0eu);
  EXPECT_EQ(r.z, 0xa20bc7c6u);
  EXPECT_EQ(r.w, 0x6d5451fdu);
}

TEST(Philox, AddressableAndStreamsDiffer) {
  Philox a(1337, 0), b(1337, 1);
  EXPECT_EQ(a.draw(42).x, Philox(1337, 0).draw(42).x);
  EXPECT_NE(a.draw(42).x, b.draw(42).x);
  EXPECT_NE(a.draw(42).x, a.draw(43).x);
}

TEST(Philox, UniformAndNormalMoments) {
  Philox rng(7);
  double s = 0, s2 = 0, n1 = 0, n2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    float u = rng.uniform(uint64_t(i), i % 4);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    s += u;
    s2 += u * u;
    float z = rng.normal(uint64_t(i));
    n1 += z;
    n2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.5, 0.005);
  EXPECT_NEAR(s2 / n - 0.25, 1.0 / 12, 0.005);
  EXPECT_NEAR(n1 / n, 0.0, 0.01);
  EXPECT_NEAR(n2 / n, 1.0, 0.01);
}
