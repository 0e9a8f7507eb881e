// Training checkpoints end to end (train/checkpoint.h): a run resumed from a checkpoint is bitwise the run that was
// never interrupted (also under ZeRO 1-3); SIGTERM/SIGUSR1 stop every rank with a checkpoint; bad checkpoints are
// refused by name and overwrite nothing; a checkpoint resumes at another data-parallel size and ZeRO stage.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "support/loss_agreement.h"
#include "support/run_program.h"
#include "tests/examples/checkpoint_files.h"

namespace fs = std::filesystem;

namespace {

using Result = minidl::testing::ProgramResult;

using minidl::testing::kF32SumOrder;
using minidl::testing::losses_agree;
using minidl::testing::mpiexec;
using minidl::testing::read_file;
using minidl::testing::RunConfig;
using minidl::testing::safetensors_files;
using minidl::testing::same_files;
using minidl::testing::summary_text;

class Resume : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = minidl::testing::fresh_test_dir("minidl_resume_"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // Dropout and a warmup + cosine schedule: everything that has a position to resume.
  std::string flags(int steps) const {
    return std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --eval-windows 4 --eval-every 0 "
           "--log-every 1000 --dropout 0.1 --lr 3e-3 --warmup 2 --min-lr 1e-4 --steps " +
           std::to_string(steps);
  }
  // For ZeRO: 2 layers, so that stage 3 has two blocks to gather; a batch of 6 splits over 1, 2 and 3 ranks; ring;
  // a progress line per step.
  std::string zero_flags(int steps, int zero) const {
    return std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 2 --heads 2 --embd 32 --seq 16 --batch 6 --threads 1 --eval-windows 4 --eval-every 0 "
           "--dropout 0.1 --lr 3e-3 --warmup 2 --min-lr 1e-4 --backend ring --progress lines --log-every 1 --steps " +
           std::to_string(steps) + " --zero " + std::to_string(zero);
  }
  Result run(int ranks, const std::string& args) { return minidl::testing::run_program(mpiexec(ranks) + args); }
  // A run saving every 4 steps into path(dir); its exit code checked.
  Result checkpointed(int ranks, const std::string& args, const std::string& dir) {
    Result r = run(ranks, args + " --checkpoint-dir " + path(dir) + " --save-every 4");
    EXPECT_EQ(r.code, 0) << r.out;
    return r;
  }
  // path(from)'s step-4 checkpoint copied into a fresh path(dir) and resumed there by `args` at `ranks`.
  Result resumed_copy(int ranks, const std::string& args, const std::string& from, const std::string& dir) {
    fs::create_directories(path(dir));
    fs::copy(path(from) + "/step-00000004", path(dir) + "/step-00000004", fs::copy_options::recursive);
    return run(ranks, args + " --checkpoint-dir " + path(dir) + " --save-every 4 --resume auto");
  }
  fs::path dir_;
};

}  // namespace

// Train 8 steps straight, or 4, stop, and 4 more from the step-4 checkpoint: the final checkpoints (weights, AdamW
// moments, step counters, loss scaler) are byte for byte the same, in f32 with accumulation, bf16 and fp16, at 1
// and 2 ranks.
TEST_F(Resume, EightStepsStraightEqualFourPlusFour) {
  struct Case {
    int ranks;
    const char* extra;
  };
  for (Case c : {Case{1, "--grad-accum 2"}, Case{1, "--amp bf16"}, Case{1, "--amp fp16"}, Case{2, "--grad-accum 2"},
                 Case{2, "--amp fp16"}}) {
    SCOPED_TRACE(std::to_string(c.ranks) + " rank(s) " + c.extra);
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) { return run(c.ranks, flags(steps) + " " + c.extra + args); },
        path("a"), path("b"));
  }
}

// fp16 resumed across the loss scaler's changes: from 2^24 the first steps overflow and back off, then the scale
// doubles every 2 clean steps and overflows again, so the step-4 checkpoint holds a scaler in the middle of its
// count (clean steps, skipped steps, hysteresis), and the resumed run must go on from exactly there: its step-8
// checkpoint, state.json included, is byte for byte the straight run's.
TEST_F(Resume, Fp16ResumesAcrossAScaleGrowthAndAnOverflow) {
  const std::string scaling =
      " --amp fp16 --loss-scale-init 16777216 --loss-scale-growth-interval 2 --progress lines "
      "--log-every 1";
  std::string straight_out;
  minidl::testing::expect_straight_equals_four_plus_four(
      [&](int steps, const std::string& args) {
        Result r = run(1, flags(steps) + scaling + args);
        if (args.find("--save-every 8") != std::string::npos) straight_out = r.out;
        return r;
      },
      path("a"), path("b"));
  // The straight run went through both: a step that overflowed (skipped grows) after one that did not, and a
  // growth (the scale rises from one step to the next).
  std::regex re("\\| scale ([0-9.e+]+) \\| skipped ([0-9]+)");
  std::vector<std::pair<double, int>> seen;
  for (auto it = std::sregex_iterator(straight_out.begin(), straight_out.end(), re); it != std::sregex_iterator(); ++it)
    seen.emplace_back(std::stod((*it)[1]), std::stoi((*it)[2]));
  ASSERT_EQ(seen.size(), 8u) << straight_out;
  bool grew = false, overflowed_after_growing = false;
  for (size_t i = 1; i < seen.size(); ++i) {
    grew |= seen[i].first > seen[i - 1].first;
    overflowed_after_growing |= grew && seen[i].second > seen[i - 1].second;
  }
  EXPECT_TRUE(grew && overflowed_after_growing) << straight_out;
}

// SIGTERM to a process; with 2 ranks, SIGUSR1 to rank 1 alone (as a scheduler signals one task): every rank
// finishes the step, a checkpoint is written, exit 0; resuming it to step K + 3 equals a straight run of K + 3 steps
// (constant LR: --steps does not change the schedule). The signal does not go through mpirun's forwarding: under
// load, Open MPI 4.1's mpirun was once killed by the SIGUSR1 it should have forwarded (CI, sanitize stage).
TEST_F(Resume, PreemptionSavesAndResumesExactly) {
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)");
    fs::remove_all(path("ck"));
    const std::string constant = " --warmup 0 --min-lr 3e-3 --checkpoint-dir " + path("ck");
    // The process to signal: the program itself, or mpirun's child whose rank is 1 (from /proc: no procps needed).
    const std::string target =
        ranks == 1 ? "$pid"
                   : "$(for c in $(grep -l \"^PPid:.$pid\\$\" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3); do "
                     "grep -qz '^OMPI_COMM_WORLD_RANK=1$' /proc/$c/environ && echo $c; done)";
    const char* signal = ranks == 1 ? "TERM" : "USR1";
    // The signal goes out once step 20 is logged, not after a fixed time: a tiny step takes 0.3 ms, so a timer
    // would make the straight run below thousands of steps long on a quiet machine and few on a loaded one.
    const std::string log = path("pre.log");
    Result pre = minidl::testing::run_program(
        "( " + mpiexec(ranks) + flags(1000000) + constant + " --progress lines --log-every 10 > " + log +
        " 2>&1 & pid=$!; for i in $(seq 1200); do grep -q '^step 20/' " + log +
        " && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done; kill -" + signal + " " + target +
        " || kill -KILL $pid; wait $pid; echo EXIT=$?; cat " + log + " )");
    ASSERT_NE(pre.out.find("EXIT=0"), std::string::npos) << pre.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(pre.out, m, std::regex("preempted: saved .*step-0*([0-9]+)"))) << pre.out;
    const int k = std::stoi(m[1]);
    ASSERT_TRUE(fs::exists(path("ck") + "/" + m[0].str().substr(m[0].str().find("step-")) + "/DONE")) << pre.out;
    Result resumed = run(ranks, flags(k + 3) + constant + " --resume auto --save " + path("resumed.safetensors"));
    ASSERT_EQ(resumed.code, 0) << resumed.out;
    Result straight = run(ranks, flags(k + 3) + " --warmup 0 --min-lr 3e-3 --save " + path("straight.safetensors"));
    ASSERT_EQ(straight.code, 0) << straight.out;
    EXPECT_TRUE(read_file(path("resumed.safetensors")) == read_file(path("straight.safetensors")));
  }
}

// Truncated, corrupted, missing, incomplete and mismatched checkpoints: a message naming the file and the problem,
// exit 2, and nothing written.
TEST_F(Resume, BadCheckpointsAreRefusedByName) {
  ASSERT_EQ(run(1, flags(2) + " --checkpoint-dir " + path("ck") + " --save-every 2").code, 0);
  const std::string good = path("ck") + "/step-00000002";
  auto refused = [&](const std::string& dir, const std::string& extra, std::initializer_list<const char*> parts) {
    Result r = run(1, flags(4) + " --resume " + dir + " --save " + path("out.safetensors") + extra);
    EXPECT_EQ(r.code, 2) << r.out;
    for (const char* p : parts) EXPECT_NE(r.out.find(p), std::string::npos) << "missing '" << p << "' in " << r.out;
    EXPECT_FALSE(fs::exists(path("out.safetensors")));
  };
  auto copy = [&](const std::string& name) {
    fs::copy(good, path(name), fs::copy_options::recursive);
    return path(name);
  };
  std::string t = copy("truncated");
  fs::resize_file(t + "/model.safetensors", fs::file_size(t + "/model.safetensors") - 10);
  refused(t, "", {"model.safetensors", "truncated"});
  std::string c = copy("corrupted");
  {
    std::fstream f(c + "/optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  refused(c, "", {"optimizer.safetensors", "corrupted"});
  std::string missing = copy("missing");
  fs::remove(missing + "/state.json");
  refused(missing, "", {"missing file state.json"});
  std::string incomplete = copy("incomplete");
  fs::remove(incomplete + "/DONE");
  refused(incomplete, "", {"incomplete"});
  refused(good, " --layers 2", {"--layers 2 does not match the checkpoint"});
  // The good checkpoint itself was never touched.
  Result ok = run(1, flags(4) + " --resume " + good);
  EXPECT_EQ(ok.code, 0) << ok.out;
  // --resume auto skips a newer incomplete checkpoint with a message.
  fs::copy(incomplete, path("ck") + "/step-00000003", fs::copy_options::recursive);
  Result skip = run(1, flags(4) + " --checkpoint-dir " + path("ck") + " --resume auto");
  EXPECT_EQ(skip.code, 0) << skip.out;
  EXPECT_NE(skip.out.find("skipping " + path("ck") + "/step-00000003: incomplete"), std::string::npos) << skip.out;
  EXPECT_NE(skip.out.find("resuming from " + good), std::string::npos) << skip.out;
  // --resume auto skips a newer checkpoint that fails verification (one flipped byte), naming it and the problem, so
  // a crash-restart loop cannot stick on a damaged directory; an explicit --resume of it is still refused (above).
  fs::remove_all(path("ck") + "/step-00000003");
  fs::copy(c, path("ck") + "/step-00000003", fs::copy_options::recursive);
  Result past = run(1, flags(4) + " --checkpoint-dir " + path("ck") + " --resume auto");
  EXPECT_EQ(past.code, 0) << past.out;
  EXPECT_NE(past.out.find("skipping " + path("ck") + "/step-00000003: "), std::string::npos) << past.out;
  EXPECT_NE(past.out.find("(corrupted)"), std::string::npos) << past.out;
  EXPECT_NE(past.out.find("resuming from " + good), std::string::npos) << past.out;
}

// Resharding: a checkpoint written by one process continues at two data-parallel ranks (the optimizer state is
// stored per logical parameter), close to the run that never stopped.
TEST_F(Resume, CheckpointResumesAtAnotherDataParallelSize) {
  Result straight = run(1, flags(8));
  ASSERT_EQ(straight.code, 0) << straight.out;
  ASSERT_EQ(run(1, flags(8) + " --checkpoint-dir " + path("ck") + " --save-every 4").code, 0);
  fs::remove_all(path("ck") + "/step-00000008");
  Result two = run(2, flags(8) + " --checkpoint-dir " + path("ck") + " --resume auto");
  ASSERT_EQ(two.code, 0) << two.out;
  EXPECT_TRUE(losses_agree(std::stod(summary_text(two.out, "val_loss")),
                           std::stod(summary_text(straight.out, "val_loss")), kF32SumOrder))
      << two.out;
}

namespace {

// The loss of every step from `first` on, from the progress lines (--progress lines --log-every 1).
std::vector<double> step_losses(const std::string& out, int first) {
  std::vector<double> losses;
  std::regex re("step ([0-9]+)/[0-9]+ \\| loss ([-0-9.e+naif]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    if (std::stoi((*it)[1]) >= first) losses.push_back(std::stod((*it)[2]));
  return losses;
}

}  // namespace

// ZeRO 1, 2 and 3 at dp 2: 8 steps straight vs 4 + resume + 4 give byte-identical checkpoints (weights and AdamW
// state) and the same losses. And the checkpoint a ZeRO run writes is byte for byte the DDP run's: at dp 2 over
// ring every stage's updates are DDP's, so this checks the gather of the shards (placement, padding dropped, the
// stage-3 weights) against an independent layout.
TEST_F(Resume, ZeroStagesResumeBitwiseAndWriteDDPsCheckpoint) {
  Result ddp = run(2, zero_flags(8, 0) + " --checkpoint-dir " + path("ddp") + " --save-every 8");
  ASSERT_EQ(ddp.code, 0) << ddp.out;
  struct Case {
    int zero;
    const char* extra;  // the last case: the fp16 scaler, accumulation and recomputation under stage 3
  };
  for (Case c : {Case{1, ""}, Case{2, ""}, Case{3, ""}, Case{3, " --amp fp16 --grad-accum 3 --recompute block"}}) {
    SCOPED_TRACE("--zero " + std::to_string(c.zero) + c.extra);
    const std::string a = path("a" + std::to_string(c.zero)), b = path("b" + std::to_string(c.zero));
    fs::remove_all(a);
    fs::remove_all(b);
    Result straight = run(2, zero_flags(8, c.zero) + c.extra + " --checkpoint-dir " + a + " --save-every 8");
    ASSERT_EQ(straight.code, 0) << straight.out;
    Result first = run(2, zero_flags(8, c.zero) + c.extra + " --checkpoint-dir " + b + " --save-every 4");
    ASSERT_EQ(first.code, 0) << first.out;
    fs::remove_all(b + "/step-00000008");
    Result second =
        run(2, zero_flags(8, c.zero) + c.extra + " --checkpoint-dir " + b + " --save-every 4 --resume auto");
    ASSERT_EQ(second.code, 0) << second.out;
    EXPECT_NE(second.out.find("resuming from " + b + "/step-00000004"), std::string::npos) << second.out;
    EXPECT_TRUE(same_files(a + "/step-00000008", b + "/step-00000008"));
    EXPECT_EQ(step_losses(second.out, 5), step_losses(straight.out, 5)) << second.out;
    EXPECT_EQ(step_losses(second.out, 5).size(), 4u) << second.out;
    EXPECT_EQ(summary_text(second.out, "val_loss"), summary_text(straight.out, "val_loss"));
    EXPECT_EQ(summary_text(second.out, "loss_scale"), summary_text(straight.out, "loss_scale"));
    if (*c.extra == 0)
      EXPECT_TRUE(same_files(a + "/step-00000008", path("ddp") + "/step-00000008", RunConfig::kMayDiffer));
  }
}

// Resharding: checkpoints written at dp 2 by DDP (--zero 0) and by ZeRO-2 continue at another dp size and ZeRO
// stage. Against the straight dp-2 DDP run: at dp 2 (ZeRO 1 and 3) the final checkpoint is byte-identical (two
// ranks' average has one rounding whatever the stage); at dp 1 and 3 the mean loss is summed in another order, so
// the losses agree within kF32SumOrder.
TEST_F(Resume, ZeroCheckpointsReshardAcrossStagesAndDataParallelSizes) {
  Result ddp = checkpointed(2, zero_flags(8, 0), "src0");
  checkpointed(2, zero_flags(8, 2), "src2");
  const std::vector<double> reference = step_losses(ddp.out, 5);
  ASSERT_EQ(reference.size(), 4u) << ddp.out;
  struct Case {
    const char* from;
    int ranks, zero;
    bool bitwise;
  };
  for (Case c : {Case{"src0", 1, 0, false}, Case{"src0", 2, 3, true}, Case{"src0", 3, 3, false},
                 Case{"src2", 1, 1, false}, Case{"src2", 2, 1, true}, Case{"src2", 3, 1, false}}) {
    SCOPED_TRACE(std::string(c.from) + " resumed at dp " + std::to_string(c.ranks) + " --zero " +
                 std::to_string(c.zero));
    const std::string dir = "out_" + std::string(c.from) + "_" + std::to_string(c.ranks), out = path(dir);
    Result r = resumed_copy(c.ranks, zero_flags(8, c.zero), c.from, dir);
    ASSERT_EQ(r.code, 0) << r.out;
    const std::vector<double> losses = step_losses(r.out, 5);
    ASSERT_EQ(losses.size(), reference.size()) << r.out;
    // The progress line's losses are printed to 4 decimals: within one unit of the last place. The summary's are not.
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], reference[i], 1.01e-4) << "step " << i + 5;
    EXPECT_TRUE(losses_agree(std::stod(summary_text(r.out, "val_loss")), std::stod(summary_text(ddp.out, "val_loss")),
                             kF32SumOrder));
    if (c.bitwise)
      EXPECT_TRUE(same_files(out + "/step-00000008", path("src0") + "/step-00000008", RunConfig::kMayDiffer));
  }
}

// Context parallelism keeps whole tensors in its checkpoints, as every layout does: a checkpoint written at cp 2
// (ZeRO-1 over its dp x cp = 2 ranks) continues at cp 1, at cp 4 under ZeRO-3, and at cp 2 x dp 2 under ZeRO-2, and
// a cp 1 checkpoint continues at cp 2. Against the straight cp 1 run: steps 5-8's losses (printed to 4 decimals)
// within one unit of the last place, the validation loss within kF32SumOrder.
TEST_F(Resume, ContextParallelCheckpointsResumeAtAnyCp) {
  Result straight = checkpointed(1, zero_flags(8, 0), "src1");
  checkpointed(2, zero_flags(8, 1) + " --cp 2", "src2");
  const std::vector<double> reference = step_losses(straight.out, 5);
  ASSERT_EQ(reference.size(), 4u) << straight.out;
  struct Case {
    const char* from;
    int ranks;
    std::string layout;
  };
  const std::vector<Case> cases = {{"src2", 1, " --zero 0"},
                                   {"src2", 4, " --zero 3 --cp 4"},
                                   {"src2", 4, " --zero 2 --cp 2 --dp 2"},
                                   {"src1", 2, " --zero 0 --cp 2"}};
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    SCOPED_TRACE(std::string(c.from) + " resumed with" + c.layout);
    const std::string dir = "out" + std::to_string(k);
    Result r = resumed_copy(c.ranks, zero_flags(8, 0) + c.layout, c.from, dir);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resuming from " + path(dir) + "/step-00000004"), std::string::npos) << r.out;
    const std::vector<double> losses = step_losses(r.out, 5);
    ASSERT_EQ(losses.size(), reference.size()) << r.out;
    for (size_t i = 0; i < losses.size(); ++i) EXPECT_NEAR(losses[i], reference[i], 1.01e-4) << "step " << i + 5;
    EXPECT_TRUE(losses_agree(std::stod(summary_text(r.out, "val_loss")),
                             std::stod(summary_text(straight.out, "val_loss")), kF32SumOrder));
  }
}

// A mixture of experts resumes bit for bit, its expert biases (bias balancing's buffers, which choose the experts)
// included: 8 steps straight and 4 + 4 leave the same final checkpoint, at 1 rank, 2 data-parallel ranks and 2
// pipeline stages.
TEST_F(Resume, MixtureOfExpertsStraightEqualsFourPlusFour) {
  const std::string moe =
      " --layers 2 --model llama --moe-experts 4 --moe-balance bias --moe-bias-rate 0.01 --moe-capacity 1.5";
  int k = 0;
  for (auto [ranks, layout] : {std::pair<int, std::string>{1, ""}, {2, " --dp 2"}, {2, " --pp 2 --micro-batches 2"}}) {
    SCOPED_TRACE(std::to_string(ranks) + " rank(s)" + layout);
    ++k;
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) {
          std::string f = flags(steps);
          f.replace(f.find("--layers 1"), 10, "");
          return run(ranks, f + moe + layout + args);
        },
        path("a" + std::to_string(k)), path("b" + std::to_string(k)));
  }
}

// Expert parallelism's checkpoints (every expert gathered into the model file; each expert's AdamW moments written
// by the first replica holding it) resume at any ep: 4 steps at dp 2 × ep 2 and 4 more at ep 1, 2 or 4 over 1, 2
// or 4 ranks give the straight run's losses.
TEST_F(Resume, ExpertParallelCheckpointsResumeAtAnyEp) {
  auto flags = [&](int steps) {
    std::string f = zero_flags(steps, 0);
    f.replace(f.find("--batch 6"), 9, "--batch 8");
    return f + " --model llama --moe-experts 4 --moe-balance bias --moe-bias-rate 0.01 --moe-capacity 1.5";
  };
  Result straight = checkpointed(2, flags(8) + " --dp 2 --ep 2", "src");
  const std::vector<double> reference = step_losses(straight.out, 5);
  ASSERT_EQ(reference.size(), 4u) << straight.out;
  const std::vector<std::pair<int, std::string>> cases = {
      {1, ""}, {2, " --dp 2"}, {4, " --dp 4 --ep 4"}, {4, " --dp 4 --ep 2"}};
  for (size_t k = 0; k < cases.size(); ++k) {
    const auto& [ranks, layout] = cases[k];
    SCOPED_TRACE(std::to_string(ranks) + " ranks" + layout);
    const std::string dir = "out" + std::to_string(k);
    Result r = resumed_copy(ranks, flags(8) + layout, "src", dir);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resuming from " + path(dir) + "/step-00000004"), std::string::npos) << r.out;
    const std::vector<double> losses = step_losses(r.out, 5);
    ASSERT_EQ(losses.size(), reference.size()) << r.out;
    for (size_t i = 0; i < losses.size(); ++i)
      EXPECT_NEAR(losses[i], reference[i], 1e-5 * reference[i]) << "step " << i + 5;
  }
}
