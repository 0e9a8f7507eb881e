// Every exercise's skeleton (what `minidl-exercise start NAME` writes, generated here from dist/naive/ at build time)
// compiles, all of them in one translation unit, and calling into an unwritten region throws a NotImplementedError
// that names the exercise and the function it is in.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "ddp/ddp.h"
#include "ddp_overlap/ddp_overlap.h"
#include "pipeline/gpipe.h"
#include "pipeline/one_f_one_b.h"
#include "ring/ring.h"
#include "ring_attention/ring_attention.h"
#include "support/mpi_test.h"
#include "tensor_parallel/tensor_parallel.h"
#include "zero1/zero1.h"
#include "zero3/zero3.h"

using namespace minidl;

namespace {

void expect_todo(const char* exercise, const char* function, const std::function<void()>& call) {
  SCOPED_TRACE(std::string(exercise) + ": " + function);
  try {
    call();
    ADD_FAILURE() << "returned: the skeleton should throw NotImplementedError";
  } catch (const NotImplementedError& e) {
    EXPECT_EQ(e.exercise, exercise);
    EXPECT_EQ(e.function, function);
    EXPECT_FALSE(e.hint.empty());
    EXPECT_NE(std::string(e.what()).find(std::string("exercise ") + exercise + ": " + function), std::string::npos)
        << e.what();
  }
}

}  // namespace

TEST(ExerciseSkeletons, EachRegionThrowsNamingItsExerciseAndFunction) {
  auto group = dist::make_process_group("mpi", minidl::testing::mpi_context().world());
  const nn::GPTConfig cfg{13, 8, 2, 2, 16, 0.0, true};
  Tensor buffer = Tensor::zeros({6});
  expect_todo("ring", "ring_reduce_scatter", [&] { dist::naive::ring_reduce_scatter(*group, buffer); });
  expect_todo("ring", "ring_all_gather", [&] { dist::naive::ring_all_gather(*group, buffer); });
  expect_todo("ring", "ring_all_reduce", [&] { dist::naive::ring_all_reduce(*group, buffer, dist::ReduceOp::kSum); });
  nn::GPT model(cfg, 1);
  expect_todo("ddp", "DataParallel", [&] { dist::naive::DataParallel dp(model, *group); });
  nn::GPT overlapped(cfg, 1);
  dist::naive::OverlappedDataParallel dp(overlapped, *group, 1 << 20);
  expect_todo("ddp_overlap", "finish", [&] { dp.finish(); });
  expect_todo("zero1", "Zero1AdamW", [&] {
    dist::naive::Zero1AdamW zero(model, *group, optim::decay_groups(model.named_parameters(), 0.1), {});
  });
  nn::GPT blocks(cfg, 1);
  expect_todo("zero3", "release", [&] { dist::naive::Zero3 zero(blocks, *group); });
  Tensor x = Tensor::zeros({2, 8, 16});
  expect_todo("tensor_parallel", "f", [&] { dist::naive::f(x, *group); });
  expect_todo("tensor_parallel", "g", [&] { dist::naive::g(x, *group); });
  expect_todo("tensor_parallel", "ParallelMLP",
              [&] { dist::naive::ParallelMLP mlp(*model.block<nn::Block>(0).mlp, *group); });
  dist::naive::ParallelAttention attn(*model.block<nn::Block>(0).attn, *group);
  expect_todo("tensor_parallel", "forward", [&] { attn.forward(x); });
  expect_todo("pipeline", "pass", [&] { dist::naive::pass(2, 0, 0, true); });
  expect_todo("pipeline", "gpipe_actions", [&] { dist::naive::gpipe_actions(2, 0, 2); });
  expect_todo("pipeline", "one_f_one_b_actions", [&] { dist::naive::one_f_one_b_actions(2, 0, 2); });
  expect_todo("pipeline", "run_actions", [&] {
    dist::naive::run_actions(*group, {{dist::ActionKind::kForward, 0}}, 1, {1, 8, 16},
                             [](const Tensor& h, int) { return h; });
  });
  expect_todo("pipeline", "sum_shared_gradients", [&] { dist::naive::sum_shared_gradients(*group, {x}); });
  const Tensor qkv = Tensor::zeros({1, 2, 3 * 4});
  expect_todo("ring_attention", "ring_attention_forward",
              [&] { dist::naive::ring_attention_forward(qkv, 1, 1, *group); });
  const dist::naive::RingAttentionForward f{{Tensor::zeros({1, 1, 4}), Tensor::zeros({1, 1, 4})},
                                            {Tensor::zeros({1, 1, 1}), Tensor::zeros({1, 1, 1})}};
  expect_todo("ring_attention", "ring_attention_backward", [&] {
    dist::naive::ring_attention_backward(Tensor::zeros({1, 2, 4}), qkv, f, 1, 1, *group);
  });
}
