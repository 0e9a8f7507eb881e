// The α-β formulas of predict/collectives.h against values derived by hand, and where groups live.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "predict/collectives.h"

namespace minidl::predict {
namespace {

const Link kLink{1e-5, 1e9};  // 10 µs, 1 GB/s

TEST(PredictCollectives, RingAllReduceIsTwoRingPasses) {
  // 4 ranks, 1 MB: 2·(3/4)·1e6/1e9 s of transfer + 2·3 steps of 10 µs.
  EXPECT_DOUBLE_EQ(ring_all_reduce(4, 1e6, kLink), 1.5e-3 + 6e-5);
  EXPECT_DOUBLE_EQ(ring_all_reduce(1, 1e6, kLink), 0.0);
}

TEST(PredictCollectives, ReduceScatterAndAllGatherAreOnePassEach) {
  EXPECT_DOUBLE_EQ(ring_reduce_scatter(4, 1e6, kLink), 0.75e-3 + 3e-5);
  EXPECT_DOUBLE_EQ(ring_all_gather(4, 1e6, kLink), 0.75e-3 + 3e-5);
  EXPECT_DOUBLE_EQ(ring_reduce_scatter(2, 8e6, kLink), 4e-3 + 1e-5);
}

TEST(PredictCollectives, TreeAndPointToPoint) {
  // 8 ranks: ⌈log2 8⌉ = 3 levels up and down; S each way.
  EXPECT_DOUBLE_EQ(tree_all_reduce(8, 1e6, kLink), 2e-3 + 6e-5);
  EXPECT_DOUBLE_EQ(tree_all_reduce(5, 1e6, kLink), 2e-3 + 6e-5);  // ⌈log2 5⌉ = 3
  EXPECT_DOUBLE_EQ(point_to_point(1e6, kLink), 1e-3 + 1e-5);
}

TEST(PredictCollectives, AllReducePicksTheTreeForSmallMessagesOnManyRanks) {
  // 64 ranks, 1 kB: the ring pays 126 latencies (1.26 ms), the tree 12 (0.12 ms).
  EXPECT_DOUBLE_EQ(all_reduce(64, 1e3, kLink), tree_all_reduce(64, 1e3, kLink));
  EXPECT_NEAR(all_reduce(64, 1e3, kLink), 2e-6 + 1.2e-4, 1e-12);
  // 2 ranks, 1 GB: the ring sends S once (1 s), the tree twice.
  EXPECT_DOUBLE_EQ(all_reduce(2, 1e9, kLink), ring_all_reduce(2, 1e9, kLink));
}

TEST(PredictCollectives, GroupsFollowTheRankOrderTpFastestThenDpThenPp) {
  // dp 2 × tp 4 × pp 2 on nodes of 8: tp groups are 4 consecutive ranks, dp groups {t, 4 + t} within a stage's 8
  // ranks, pp groups {r, r + 8} across two nodes.
  const dist::Grid grid{2, 4, 2};
  EXPECT_EQ(nodes_spanned(grid, Axis::kTp, 8), 1);
  EXPECT_EQ(nodes_spanned(grid, Axis::kDp, 8), 1);
  EXPECT_EQ(nodes_spanned(grid, Axis::kPp, 8), 2);
  // On nodes of 4, each dp group spans 2 nodes; tp still 1.
  EXPECT_EQ(nodes_spanned(grid, Axis::kDp, 4), 2);
  EXPECT_EQ(nodes_spanned(grid, Axis::kTp, 4), 1);
  // 16-way data parallelism on nodes of 8 crosses nodes.
  Machine m;
  m.gpus_per_node = 8;
  m.intra = {1e-6, 300e9};
  m.inter = {1e-5, 25e9};
  EXPECT_EQ(&group_link(dist::Grid{16, 1, 1}, Axis::kDp, m), &m.inter);
  EXPECT_EQ(&group_link(dist::Grid{8, 1, 1}, Axis::kDp, m), &m.intra);
  EXPECT_EQ(&group_link(dist::Grid{2, 8, 1}, Axis::kTp, m), &m.intra);
  EXPECT_EQ(&group_link(dist::Grid{2, 8, 1}, Axis::kDp, m), &m.inter);
}

// A link measured for one collective (the CPU host's calibration) serves that collective within a node; the others
// keep intra, and a group across nodes uses inter whatever the collective. A load_machine round trip keeps them.
TEST(PredictCollectives, MeasuredLinksServeTheirCollectiveWithinANode) {
  Machine m;
  m.name = "host";
  m.gpus_per_node = 2;
  m.peak_flops_16 = m.peak_flops_32 = m.mem_bw = m.mem_capacity = 1;
  m.intra = {5e-6, 8e9};
  m.inter = {5e-6, 8e9};
  m.measured[int(Collective::kReduceScatter)] = Link{0, 1e9};
  const dist::Grid two{2, 1, 1}, four{4, 1, 1};
  EXPECT_EQ(&group_link(two, Axis::kDp, m, Collective::kReduceScatter), &*m.measured[int(Collective::kReduceScatter)]);
  EXPECT_EQ(&group_link(two, Axis::kDp, m, Collective::kAllReduce), &m.intra);
  EXPECT_EQ(&group_link(two, Axis::kDp, m, Collective::kAllGather), &m.intra);
  EXPECT_EQ(&group_link(four, Axis::kDp, m, Collective::kReduceScatter), &m.inter);
  // 2 ranks, 8 MB: half the buffer crosses, at 1 GB/s instead of 8.
  EXPECT_DOUBLE_EQ(ring_reduce_scatter(2, 8e6, group_link(two, Axis::kDp, m, Collective::kReduceScatter)), 4e-3);

  const std::string path = ::testing::TempDir() + "/minidl_machine_measured.json";
  std::ofstream(path) << machine_to_json(m);
  const Machine back = load_machine(path);
  std::remove(path.c_str());
  ASSERT_TRUE(back.measured[int(Collective::kReduceScatter)].has_value());
  EXPECT_EQ(back.measured[int(Collective::kReduceScatter)]->beta, 1e9);
  EXPECT_FALSE(back.measured[int(Collective::kAllGather)].has_value());
}

}  // namespace
}  // namespace minidl::predict
