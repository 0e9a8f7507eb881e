// predict/outer.h: local SGD's and DiLoCo's step is a replica's step plus 1/H of one outer sync (an all-reduce of
// the rank's parameters over R and the host passes around it); a parameter server's is a worker's forward and
// backward plus the exchange, which a synchronous server serialises over W pushes and replies and an asynchronous
// one answers push by push, so that W workers' pushes bound its step.
#include <gtest/gtest.h>

#include "core/error.h"
#include "predict/collectives.h"
#include "predict/outer.h"
#include "predict/predict.h"
#include "tests/predict/fixtures.h"

namespace minidl::predict {
namespace {

using testing::baby;
using testing::toy_machine;

// The baby config's parameters: 4 blocks of 12C² + 13C, wte (65·C), wpe (64·C) and ln_f (2C) at C = 128.
constexpr double kC = 128, kParams = 4 * (12 * kC * kC + 13 * kC) + 65 * kC + 64 * kC + 2 * kC;

TEST(PredictOuter, LocalSgdIsAReplicasStepAndAnHthOfItsSync) {
  const Machine m = toy_machine();
  Layout replica;  // one rank, a quarter of the batch
  const Prediction alone = predict(Workload{baby(), 6}, replica, m);
  EXPECT_DOUBLE_EQ(alone.rank_params, kParams);
  for (bool diloco : {false, true}) {
    Layout l;
    l.sync = diloco ? OuterSync::kDiLoCo : OuterSync::kLocalSgd;
    l.replicas = 4, l.sync_every = 8;
    const Prediction p = predict(Workload{baby(), 24}, l, m);
    // 16 passes of 4Ψ for local SGD, 24 for DiLoCo, at 100 GB/s; the ring over 4 ranks within the node.
    const double sync = ring_all_reduce(4, 4 * kParams, m.intra) + (diloco ? 24 : 16) * 4 * kParams / 100e9;
    EXPECT_DOUBLE_EQ(outer_sync_seconds(kParams, 4, diloco, m.intra, m), sync);
    EXPECT_NEAR(p.time.outer, sync / 8, 1e-15);
    EXPECT_NEAR(p.time.total(), alone.time.total() + sync / 8, 1e-12);
    EXPECT_EQ(p.layout.gpus(), 4);
    EXPECT_NEAR(p.tokens_per_s, 24 * 64 / p.time.total(), 1e-6);
  }
  // Replicas over two nodes meet over the inter-node link.
  Layout wide;
  wide.sync = OuterSync::kLocalSgd, wide.replicas = 8;
  EXPECT_NEAR(predict(Workload{baby(), 24}, wide, m).time.outer, outer_sync_seconds(kParams, 8, false, m.inter, m),
              1e-15);
}

TEST(PredictOuter, ASyncServerSerialisesItsWorkersAnAsyncOneAnswersPushes) {
  const Machine m = toy_machine();
  const double compute = 1e-3, adamw = 1e-4;
  const double pass = 4 * kParams / 100e9;  // one host pass over the parameters
  const double message = point_to_point(4 * kParams, m.intra);
  // One worker, one server: the worker's 14 passes, the push (received and copied out), the sum's division, the
  // update's 12 passes and AdamW, the reply (packed and sent).
  const PsExchange one = ps_exchange(kParams, 1, 1, true, compute, adamw, m.intra, m);
  EXPECT_NEAR(one.exchange, 14 * pass + (message + 2 * pass) + 2 * pass + 12 * pass + (2 * pass + message), 1e-15);
  EXPECT_DOUBLE_EQ(one.optimizer, adamw);
  // Synchronous: each extra worker adds a push, a reply and 3 passes of the sum.
  const PsExchange two = ps_exchange(kParams, 2, 1, true, compute, adamw, m.intra, m);
  EXPECT_NEAR(two.exchange - one.exchange, 2 * message + 4 * pass + 3 * pass, 1e-15);
  // Asynchronous with few workers: a worker's round (compute, its passes, one answer); with many, the server's W
  // answers a step.
  const double answer = (message + 2 * pass) + 2 * pass + 12 * pass + adamw + (2 * pass + message);
  const PsExchange few = ps_exchange(kParams, 1, 1, false, compute, adamw, m.intra, m);
  EXPECT_NEAR(few.exchange + compute + few.optimizer, compute + 14 * pass + answer, 1e-15);
  const PsExchange many = ps_exchange(kParams, 64, 1, false, compute, adamw, m.intra, m);
  EXPECT_NEAR(many.exchange + compute + many.optimizer, 64 * answer, 1e-12);
  // Two servers halve each one's messages and passes.
  const PsExchange halves = ps_exchange(kParams, 64, 2, false, compute, adamw / 2, m.intra, m);
  EXPECT_LT(halves.exchange + halves.optimizer, many.exchange + many.optimizer);

  // In a prediction: a worker's forward and backward on its share of the batch, no optimizer state on it.
  Layout l;
  l.dp = 2, l.ps_servers = 1;
  const Prediction p = predict(Workload{baby(), 24}, l, m);
  const Prediction worker = predict(Workload{baby(), 12}, Layout{}, m);
  EXPECT_DOUBLE_EQ(p.time.compute, worker.time.compute);
  EXPECT_DOUBLE_EQ(p.memory.optimizer, 0);
  EXPECT_EQ(p.layout.gpus(), 3);
  EXPECT_NEAR(p.time.outer, ps_exchange(kParams, 2, 1, true, p.time.compute, p.time.optimizer, m.intra, m).exchange,
              1e-15);
  l.ps_mode = PsMode::kAsync;
  const Prediction a = predict(Workload{baby(), 24}, l, m);
  EXPECT_NEAR(a.time.outer, ps_exchange(kParams, 2, 1, false, a.time.compute, a.time.optimizer, m.intra, m).exchange,
              1e-15);
  EXPECT_NE(a.time.outer, p.time.outer);
}

TEST(PredictOuter, RefusesWhatTheTrainerRefuses) {
  const Workload w{baby(), 24};
  Layout zero3;
  zero3.sync = OuterSync::kDiLoCo, zero3.replicas = 2, zero3.dp = 2, zero3.zero = 3;
  EXPECT_NE(refusal(w, zero3).find("ZeRO-3"), std::string::npos);
  Layout ps_tp;
  ps_tp.ps_servers = 1, ps_tp.tp = 2;
  EXPECT_NE(refusal(w, ps_tp).find("whole models"), std::string::npos);
  Layout replicas_alone;
  replicas_alone.replicas = 2;
  EXPECT_NE(refusal(w, replicas_alone).find("need local SGD or DiLoCo"), std::string::npos);
  // The flags' names, parsed as the trainer parses them.
  EXPECT_EQ(parse_outer_sync("diloco"), OuterSync::kDiLoCo);
  EXPECT_EQ(parse_outer_sync("ddp"), OuterSync::kNone);
  EXPECT_EQ(parse_ps_mode("ssp:2"), PsMode::kSsp);
  EXPECT_THROW(parse_outer_sync("gossip"), Error);
  EXPECT_THROW(parse_ps_mode("ssp:x"), Error);
  Layout uneven;
  uneven.sync = OuterSync::kLocalSgd, uneven.replicas = 5;
  EXPECT_NE(refusal(w, uneven).find("x replicas 5 does not divide the global batch 24"), std::string::npos);
}

}  // namespace
}  // namespace minidl::predict
