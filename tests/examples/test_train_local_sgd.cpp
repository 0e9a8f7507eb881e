// train_gpt with --sync local-sgd | diloco (dist/local_sgd.h) end to end: the counters (ceil(steps / H) syncs of the
// parameter bytes), checkpoints that resume bitwise in the middle of an H-step window and at its boundary (each
// replica's model and AdamW state, DiLoCo's θ_global and momentum: train/checkpoint.h), the 16-bit communication
// hooks (dist/comm_hook.h) against f32, and bad input refused by name with exit code 2.
//
// Oracle: the run that never stopped (its final checkpoint byte for byte, its validation loss as printed).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include "support/run_program.h"
#include "tests/examples/checkpoint_files.h"

namespace fs = std::filesystem;

namespace {

using Result = minidl::testing::ProgramResult;
using minidl::testing::mpiexec;

class TrainLocalSgd : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = minidl::testing::fresh_test_dir("minidl_local_sgd_"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Dropout and a warmup + cosine schedule: everything that has a position to resume; 2 replicas.
  std::string flags(int steps, const std::string& sync) const {
    return std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4 --eval-every 0 "
           "--log-every 1000 --dropout 0.1 --lr 3e-3 --warmup 2 --min-lr 1e-4 --replica-groups 2 --sync " +
           sync + " --steps " + std::to_string(steps);
  }
  Result run(int ranks, const std::string& args) { return minidl::testing::run_program(mpiexec(ranks) + args); }
  fs::path dir_;
};

}  // namespace

// 8 steps straight against 4, a stop and 4 more: the step-8 checkpoints are the same bytes, every replica's and
// DiLoCo's state, whether step 4 is inside a window (H 3) or ends one (H 2); with dp 2 and ZeRO-1 inside each
// replica at 4 ranks. The layout on disk is train/checkpoint.h's.
TEST_F(TrainLocalSgd, ResumesBitwiseInsideAWindowAndAtItsEnd) {
  struct Case {
    int ranks;
    const char* sync;
  };
  for (Case c : {Case{2, "diloco --sync-every 3"}, Case{2, "diloco --sync-every 2"},
                 Case{2, "local-sgd --sync-every 3"}, Case{4, "diloco --sync-every 3 --zero 1"}}) {
    SCOPED_TRACE(c.sync);
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) { return run(c.ranks, flags(steps, c.sync) + args); }, path("a"),
        path("b"));
  }
  const fs::path step = path("b") + "/step-00000004";
  EXPECT_TRUE(fs::exists(step / "DONE") && fs::exists(step / "manifest.json"));
  EXPECT_TRUE(fs::exists(step / "replica-00000" / "model.safetensors") &&
              fs::exists(step / "replica-00001" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(step / "outer-00000-of-00002.safetensors") &&
              fs::exists(step / "outer-00001-of-00002.safetensors"));
  // Mid-window the replicas differ: their models are not the same bytes.
  EXPECT_NE(minidl::testing::read_file(step / "replica-00000" / "model.safetensors"),
            minidl::testing::read_file(step / "replica-00001" / "model.safetensors"));
}

// The summary's counter: ceil(8 / 3) = 3 syncs, each of the parameters' f32 bytes.
TEST_F(TrainLocalSgd, CountsCeilStepsOverHSyncsOfTheParameterBytes) {
  Result r = run(2, flags(8, "diloco --sync-every 3"));
  ASSERT_EQ(r.code, 0) << r.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex("minidl train_gpt: ([0-9]+) parameters"))) << r.out;
  const double mib = std::stod(m[1]) * 4 / double(1 << 20);
  char expected[128];
  std::snprintf(expected, sizeof expected, "outer sync: diloco every 3 steps over 2 replicas: 3 syncs of %.2f MiB",
                mib);
  EXPECT_NE(r.out.find(expected), std::string::npos) << expected << "\n" << r.out;
  EXPECT_NE(r.out.find("sync=diloco every=3 replicas=2"), std::string::npos) << r.out;
}

// The communication hooks train as f32 does: DDP with --comm-hook bf16 / fp16 / powersgd:4 and DiLoCo with
// --outer-comm-hook fp16 end within 1% of the f32 runs' validation loss after 8 steps (the baby config's 300 steps
// are in the notes), and DiLoCo's sync line counts half the bytes.
TEST_F(TrainLocalSgd, CommHooksTrainWithinOnePercentOfF32) {
  auto val_loss = [](const Result& r) { return std::stod(minidl::testing::summary_text(r.out, "val_loss")); };
  const std::string ddp = std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
                          " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4 "
                          "--eval-every 0 --log-every 1000 --lr 3e-3 --steps 8";
  Result f32 = run(2, ddp);
  ASSERT_EQ(f32.code, 0) << f32.out;
  for (const char* hook : {" --comm-hook bf16", " --comm-hook fp16", " --comm-hook powersgd:4 --powersgd-start 4"}) {
    Result r = run(2, ddp + hook);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NEAR(val_loss(r), val_loss(f32), 0.01 * val_loss(f32)) << hook;
  }
  Result outer = run(2, flags(8, "diloco --sync-every 2"));
  Result fp16 = run(2, flags(8, "diloco --sync-every 2 --outer-comm-hook fp16"));
  ASSERT_EQ(outer.code, 0) << outer.out;
  ASSERT_EQ(fp16.code, 0) << fp16.out;
  EXPECT_NEAR(val_loss(fp16), val_loss(outer), 0.01 * val_loss(outer));
  std::smatch a, b;
  const std::regex mib("4 syncs of ([0-9.]+) MiB");
  ASSERT_TRUE(std::regex_search(outer.out, a, mib) && std::regex_search(fp16.out, b, mib)) << outer.out << fp16.out;
  EXPECT_NEAR(std::stod(b[1]), std::stod(a[1]) / 2, 0.006);  // printed with 2 decimals
}

// --inject-delay RANK:MS makes that rank a straggler on demand: the per-rank line names it, in DDP (where the other
// rank waits for it) as inside a local-SGD replica.
TEST_F(TrainLocalSgd, AnInjectedDelayIsNamedAsTheStraggler) {
  const std::string base = std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
                           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4 "
                           "--eval-every 0 --log-every 1 --progress lines --steps 3 --inject-delay 1:60";
  for (const std::string& args : {base, base + " --replica-groups 2 --sync local-sgd --sync-every 2"}) {
    Result r = run(2, args);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("rank 1 is a straggler"), std::string::npos) << args << "\n" << r.out;
  }
}

// Bad input: exit code 2 and a message naming the flag and the reason; nothing written.
TEST_F(TrainLocalSgd, RefusesByName) {
  struct Case {
    int ranks;
    std::string args, message;
  };
  const Case cases[] = {
      {2, flags(4, "diloco --sync-every 0"), "--sync-every"},
      {2, flags(4, "diloco") + " --replica-groups 3", "--replica-groups 3"},
      {2, flags(4, "diloco --zero 3"), "--zero 3"},
      {2, flags(4, "ddp"), "--replica-groups 2"},
      {2, flags(4, "gossip"), "gossip"},
      {2, flags(4, "diloco --outer-lr 0"), "--outer-lr"},
      {2, flags(4, "diloco --outer-momentum 1.5"), "--outer-momentum"},
      {2, flags(4, "local-sgd --outer-comm-hook fp16"), "--outer-comm-hook fp16 needs --sync diloco"},
      {2, flags(4, "diloco --comm-hook gzip"), "--comm-hook: expected none, bf16, fp16 or powersgd[:RANK], got 'gzip'"},
      {2, flags(4, "diloco --comm-hook powersgd:0"), "--comm-hook powersgd:0: expected powersgd:RANK with RANK >= 1"},
      {2, flags(4, "diloco --comm-hook powersgd --device cuda"), "--comm-hook powersgd runs on the CPU"},
      {2, flags(4, "diloco --comm-hook bf16 --zero 1"), "--comm-hook bf16 with --zero 1"},
      {2, flags(4, "diloco --inject-delay 2:10"), "--inject-delay 2:10: rank 2 is not among the 2 ranks"},
      {2, flags(4, "diloco --inject-delay 1"), "--inject-delay: expected RANK:MS"},
  };
  for (const Case& c : cases) {
    Result r = run(c.ranks, c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.message << "\n" << r.out;
  }

  // Checkpoints that cannot serve the run: another count of replicas, DiLoCo from local SGD's (no outer state),
  // DiLoCo's state at another count of ranks per replica.
  ASSERT_EQ(run(2, flags(4, "local-sgd --sync-every 3") + " --checkpoint-dir " + path("lsgd") + " --save-every 2").code,
            0);
  ASSERT_EQ(run(4, flags(4, "diloco --sync-every 3") + " --checkpoint-dir " + path("dp2") + " --save-every 2").code, 0);
  const std::string lsgd = path("lsgd") + "/step-00000002", dp2 = path("dp2") + "/step-00000002";
  const Case resumes[] = {
      {2,
       std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --steps 4 --resume " + lsgd,
       "holds the states of 2 replicas (--replica-groups 2), this run has --replica-groups 1"},
      {2, flags(4, "diloco --sync-every 3") + " --resume " + lsgd, "no DiLoCo state"},
      {2, flags(4, "diloco --sync-every 3") + " --resume " + dp2, "saved by 2 ranks per replica, this run has 1"},
  };
  for (const Case& c : resumes) {
    Result r = run(c.ranks, c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.message), std::string::npos) << c.message << "\n" << r.out;
  }
}
