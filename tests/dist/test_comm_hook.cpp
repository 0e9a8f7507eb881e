// Communication hooks (dist/comm_hook.h) and the 16-bit all-reduce under them, at 2 and 3 ranks, on "mpi" and
// "ring":
// - all_reduce_16bit keeps 16 bits on the wire (the byte counter: 2 an element, where all_reduce's staged 16-bit
//   tensors cost 4) and rounds each partial sum: at 2 ranks it is the one rounding of the exact f32 sum, bitwise; at
//   3 within two roundings; every rank ends with the same bits;
// - average() with bf16 / fp16 = the f32 mean within its derived bound, for exactly half the bytes;
// - DDP with the hook: gradients within the bound of plain DDP's, half the bucket bytes;
// - DiLoCo with a 16-bit outer hook: half the bytes counted, parameters close to the f32 hook's; local SGD refuses.
#include <gtest/gtest.h>

#include <cmath>

#include "core/half.h"
#include "core/rng.h"
#include "dist/comm_hook.h"
#include "dist/ddp.h"
#include "dist/local_sgd.h"
#include "dist/process_group.h"
#include "nn/gpt.h"
#include "support/mpi_test.h"

using namespace minidl;

namespace {

const dist::Context& ctx() { return minidl::testing::mpi_context(); }

// Rank r's values: normal draws, different on every rank, a few of them large.
std::vector<float> values(int rank, int64_t n) {
  Philox rng(11, uint64_t(rank));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(rng.normal(uint64_t(i))) * (i % 97 == 0 ? 300.0f : 1.0f);
  return v;
}

float round_to(DType dtype, float x) { return dtype == DType::bf16 ? to_float(to_bf16(x)) : to_float(to_f16(x)); }

// The bits every rank holds agree: rank 0's broadcast equals this rank's.
void expect_same_on_every_rank(dist::ProcessGroup& pg, const Tensor& t) {
  Tensor copy = t.clone();
  pg.broadcast(copy, 0)->wait();
  EXPECT_EQ(copy.to_vector(), t.to_vector()) << "rank " << pg.rank() << " differs from rank 0";
}

class CommHook : public ::testing::TestWithParam<const char*> {};

}  // namespace

TEST_P(CommHook, SixteenBitAllReduceRoundsEachPartialSumAndSendsTwoBytes) {
  auto pg = dist::make_process_group(GetParam(), ctx().world());
  const int n = pg->size();
  const int64_t count = 1001;  // not a multiple of the ring's chunks
  std::vector<std::vector<float>> all;
  for (int r = 0; r < n; ++r) all.push_back(values(r, count));
  for (DType dtype : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dtype));
    Tensor t = Tensor::from_vector(all[size_t(pg->rank())], {count}).to(dtype);
    const uint64_t before = pg->all_reduce_bytes();
    pg->all_reduce_16bit(t, dist::ReduceOp::kSum)->wait();
    EXPECT_EQ(pg->all_reduce_bytes() - before, uint64_t(2 * count));
    const std::vector<double> got = t.to_vector();
    for (int64_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;  // of the rounded inputs: the oracle, and a bound on every partial sum
      for (int r = 0; r < n; ++r) {
        exact += double(round_to(dtype, all[size_t(r)][size_t(i)]));
        magnitude += std::abs(double(round_to(dtype, all[size_t(r)][size_t(i)])));
      }
      if (n == 2) {
        EXPECT_EQ(got[size_t(i)], double(round_to(dtype, float(exact)))) << i;  // one hop: one rounding
      } else {
        const double u = dtype == DType::bf16 ? 0x1p-8 : 0x1p-11;  // a rounding's relative error, at most
        EXPECT_LE(std::abs(got[size_t(i)] - exact), (n - 1) * u * magnitude + 1e-7) << i;  // a rounding a hop
      }
    }
    expect_same_on_every_rank(*pg, t);
    // all_reduce of a 16-bit tensor stages it through f32: 4 bytes an element.
    Tensor staged = Tensor::from_vector(all[size_t(pg->rank())], {count}).to(dtype);
    const uint64_t mid = pg->all_reduce_bytes();
    pg->all_reduce(staged, dist::ReduceOp::kSum)->wait();
    EXPECT_EQ(pg->all_reduce_bytes() - mid, uint64_t(4 * count));
  }
  Tensor t = Tensor::zeros({4}, DType::bf16);
  EXPECT_THROW(pg->all_reduce_16bit(t, dist::ReduceOp::kAvg), Error);  // divide first
}

TEST_P(CommHook, AverageThroughSixteenBitsHalvesTheBytesWithinItsBound) {
  auto pg = dist::make_process_group(GetParam(), ctx().world());
  const int n = pg->size();
  const int64_t count = 777;
  const std::vector<float> mine = values(pg->rank(), count);
  Tensor exact = Tensor::from_vector(mine, {count});
  const uint64_t b0 = pg->all_reduce_bytes();
  dist::average(*pg, exact, dist::Compression::kNone)->wait();
  const uint64_t f32_bytes = pg->all_reduce_bytes() - b0;
  EXPECT_EQ(f32_bytes, uint64_t(4 * count));
  for (dist::Compression c : {dist::Compression::kBf16, dist::Compression::kFp16}) {
    SCOPED_TRACE(dist::compression_name(c));
    Tensor t = Tensor::from_vector(mine, {count});
    const uint64_t before = pg->all_reduce_bytes();
    dist::average(*pg, t, c)->wait();
    EXPECT_EQ(2 * (pg->all_reduce_bytes() - before), f32_bytes);  // exactly half
    EXPECT_EQ(t.dtype(), DType::f32);
    // x / N rounded once on every rank, then N - 1 hops each rounding a partial sum (dist/comm_hook.h): within
    // N roundings of the largest |x_r / N| summed.
    const double u = c == dist::Compression::kBf16 ? 0x1p-8 : 0x1p-11;
    const std::vector<double> got = t.to_vector(), want = exact.to_vector();
    double bound_scale = 0;
    for (int r = 0; r < n; ++r)
      for (float x : values(r, count)) bound_scale = std::max(bound_scale, double(std::abs(x)));
    for (int64_t i = 0; i < count; ++i) EXPECT_LE(std::abs(got[size_t(i)] - want[size_t(i)]), n * u * bound_scale) << i;
    expect_same_on_every_rank(*pg, t);
  }
  EXPECT_EQ(dist::compression("bf16"), dist::Compression::kBf16);
  EXPECT_THROW(dist::compression("powersgd:4"), Error);
}

// DDP over a tiny GPT with the hook: the averaged gradients within bf16's bound of plain DDP's (16-bit rounding is
// relative to each element's size, plus the sum's hops), and the buckets cost half the bytes.
TEST_P(CommHook, DdpWithAHookAveragesWithinItsBoundForHalfTheBytes) {
  auto pg = dist::make_process_group(GetParam(), ctx().world());
  const nn::GPTConfig cfg{11, 8, 2, 2, 16, 0.0, true};
  std::vector<int32_t> x(4 * 8), y(4 * 8);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int32_t((i * 7 + size_t(pg->rank()) * 3) % 11), y[i] = int32_t(i % 11);
  auto grads = [&](dist::Compression c, uint64_t* bytes) {
    nn::GPT model(cfg, 5);
    dist::DistributedDataParallel ddp(model, *pg, dist::DDPOptions{.compression = c});
    const uint64_t before = pg->all_reduce_bytes();
    model.loss(Tensor::from_vector(x, {4, 8}), Tensor::from_vector(y, {4, 8})).backward();
    *bytes = pg->all_reduce_bytes() - before;
    std::vector<std::vector<double>> g;
    for (const Tensor& p : model.parameters()) g.push_back(p.grad().to_vector());
    return g;
  };
  uint64_t f32_bytes = 0, bf16_bytes = 0;
  const auto want = grads(dist::Compression::kNone, &f32_bytes);
  const auto got = grads(dist::Compression::kBf16, &bf16_bytes);
  EXPECT_GT(bf16_bytes, 0u);
  EXPECT_EQ(2 * bf16_bytes, f32_bytes);
  ASSERT_EQ(got.size(), want.size());
  double largest = 0;
  for (const auto& g : want)
    for (double v : g) largest = std::max(largest, std::abs(v));
  for (size_t p = 0; p < want.size(); ++p)
    for (size_t i = 0; i < want[p].size(); ++i)
      EXPECT_LE(std::abs(got[p][i] - want[p][i]), pg->size() * 0x1p-8 * largest * pg->size()) << p << " " << i;
}

// DiLoCo with an fp16 outer hook: each sync counts 2 bytes a parameter, and the parameters stay within fp16's
// rounding of the f32 run's; local SGD refuses the hook by name.
TEST_P(CommHook, DiLoCoOuterHookHalvesItsBytes) {
  auto pg = dist::make_process_group(GetParam(), ctx().world());
  auto run = [&](dist::Compression c, dist::OuterStats* stats) {
    Tensor theta = Tensor::full({6}, 1.0);
    dist::OuterSync outer({theta}, *pg, {.kind = dist::OuterKind::kDiLoCo, .every = 2, .compression = c});
    for (int step = 1; step <= 6; ++step) {
      std::vector<float> p = theta.to_float_vector();
      for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.01f * float(pg->rank() + 1) * float(i + 1);
      theta.copy_(Tensor::from_vector(p, {6}));
      outer.after_step(step);
    }
    *stats = outer.stats();
    return theta.to_vector();
  };
  dist::OuterStats f32, fp16;
  const std::vector<double> want = run(dist::Compression::kNone, &f32), got = run(dist::Compression::kFp16, &fp16);
  EXPECT_EQ(f32.syncs, 3);
  EXPECT_EQ(fp16.syncs, 3);
  EXPECT_EQ(f32.bytes, 3u * 6 * 4);
  EXPECT_EQ(fp16.bytes, 3u * 6 * 2);
  // Every pseudo-gradient is off by at most 2 roundings (Δ / N, then the one hop at 2 ranks; the gradients of the
  // replicas share a sign here), and the outer steps are sums of them with positive weights: within 2 u of how
  // far θ moved (u = 2^-11, fp16's); 3 roundings at 3 ranks.
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], (pg->size() == 2 ? 2 : 3) * 0x1p-11 * std::abs(want[i] - 1.0) + 1e-6) << i;
  Tensor theta = Tensor::full({6}, 1.0);
  EXPECT_THROW(
      dist::OuterSync({theta}, *pg,
                      {.kind = dist::OuterKind::kLocalSgd, .every = 2, .compression = dist::Compression::kBf16}),
      Error);
}

INSTANTIATE_TEST_SUITE_P(Backends, CommHook, ::testing::Values("mpi", "ring"));
