// Training checkpoints of model-parallel runs (train/checkpoint.h): a checkpoint stores every tensor as one process
// holds it (the logical tensor), so a tensor-parallel run resumes bit for bit at its own tp and continues at another
// tp (or dp) within rounding, and the consolidated --save of a tp run loads at another tp and in PyTorch; the same
// for pipelines (train/checkpoint.h), with tp inside the stages (tp 2 x pp 2) and ZeRO 1-2 over them.
//
// Oracles: the uninterrupted run (bitwise, same topology); one process (the same steps, within kF32SumOrder where
// the topology changes the summation order: support/loss_agreement.h); the one-process checkpoint itself (the gathered
// AdamW moments and weights of a tp 2 run, tensor by tensor, at the same step); PyTorch's evaluation of the saved file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>

#include "nn/safetensors.h"
#include "support/loss_agreement.h"
#include "support/run_program.h"
#include "tests/examples/checkpoint_files.h"

namespace fs = std::filesystem;

namespace {

using Result = minidl::testing::ProgramResult;

using minidl::testing::kF32SumOrder;
using minidl::testing::losses_agree;
using minidl::testing::mpiexec;
using minidl::testing::safetensors_files;

double summary(const std::string& out, const std::string& key) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("summary: .*" + key + "=([-0-9.e+naif]+)")) ? std::stod(m[1]) : NAN;
}

// The tensors of the files in `dir` whose names start with `prefix` (the optimizer's files: each rank writes its own
// share of the logical tensors), by name; fails the test on a name in two files.
std::map<std::string, minidl::Tensor> tensors_of(const std::string& dir, const std::string& prefix) {
  std::map<std::string, minidl::Tensor> all;
  for (const auto& [name, bytes] : safetensors_files(dir)) {
    if (name.rfind(prefix, 0) != 0) continue;
    for (auto& [t, value] : minidl::nn::load_safetensors(dir + "/" + name).tensors)
      EXPECT_TRUE(all.emplace(t, value).second) << t << " is in two files of " << dir;
  }
  EXPECT_FALSE(all.empty()) << "no " << prefix << "* file in " << dir;
  return all;
}

// The largest |a - b| over every tensor of the `prefix` files of two checkpoint directories (the same names and
// shapes), relative to the largest |b| of the tensor; fails the test on a missing name or another shape.
double max_relative_difference(const std::string& a_dir, const std::string& b_dir, const std::string& prefix) {
  const std::map<std::string, minidl::Tensor> a = tensors_of(a_dir, prefix), b = tensors_of(b_dir, prefix);
  const std::string a_path = a_dir + "/" + prefix, b_path = b_dir + "/" + prefix;
  EXPECT_EQ(a.size(), b.size()) << a_path << " vs " << b_path;
  double worst = 0;
  for (const auto& [name, ta] : a) {
    auto it = b.find(name);
    if (it == b.end()) {
      ADD_FAILURE() << name << " is in " << a_path << " but not in " << b_path;
      continue;
    }
    if (ta.shape() != it->second.shape()) {
      ADD_FAILURE() << name << ": shape " << ta.shape() << " vs " << it->second.shape();
      continue;
    }
    const std::vector<double> x = ta.to_vector(), y = it->second.to_vector();
    double diff = 0, scale = 1e-30;
    for (size_t i = 0; i < x.size(); ++i) {
      diff = std::max(diff, std::abs(x[i] - y[i]));
      scale = std::max(scale, std::abs(y[i]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class ResumeParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("minidl_resume_parallel_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the quick brown fox. ";  // 17 distinct bytes: padded at tp 2 and 4
    std::ofstream(dir_ / "tiny.txt") << text;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  // 2 layers, 4 heads (tp 1, 2 and 4), dropout and a warmup + cosine schedule: everything that has a position.
  std::string flags(int steps) const {
    return std::string(TRAIN_GPT_BIN) + " --data " + path("tiny.txt") +
           " --layers 2 --heads 4 --embd 32 --seq 16 --batch 4 --threads 1 --eval-windows 4 --eval-every 0 "
           "--log-every 1000 --dropout 0.1 --lr 3e-3 --min-lr 1e-4 --steps " +
           std::to_string(steps) + (steps > 0 ? " --warmup 2" : "");
  }
  Result run(int ranks, const std::string& args) { return minidl::testing::run_program(mpiexec(ranks) + args); }
  // The step-4 checkpoint of run `from` (a directory under the test's), resumed on `ranks` ranks with `extra` flags.
  struct Resharded {
    const char* from;
    int ranks;
    const char* extra;
  };
  // Resumes it to step 8: the validation loss of `straight`, the run that never stopped, within kF32SumOrder.
  void expect_resumes_close_to(const Resharded& c, const Result& straight) {
    SCOPED_TRACE(std::string(c.from) + " ->" + c.extra);
    const std::string ck = path(std::string("resume_") + c.from);
    fs::remove_all(ck);
    fs::create_directories(ck);
    fs::copy(path(c.from) + "/step-00000004", ck + "/step-00000004", fs::copy_options::recursive);
    Result r = run(c.ranks, flags(8) + c.extra + " --checkpoint-dir " + ck + " --resume auto");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_NE(r.out.find("resuming from " + ck + "/step-00000004"), std::string::npos) << r.out;
    EXPECT_TRUE(losses_agree(summary(r.out, "val_loss"), summary(straight.out, "val_loss"), kF32SumOrder)) << r.out;
  }
  fs::path dir_;
};

}  // namespace

// tp 2: 8 steps straight vs 4, stop, 4 more from the step-4 checkpoint: the final checkpoints (weights and AdamW's
// moments, gathered into whole tensors) are byte for byte the same; with accumulation over ring, and with sequence
// parallelism under fp16 (the loss scaler's state resumes too).
TEST_F(ResumeParallel, TensorParallelStraightEqualsFourPlusFour) {
  for (const char* extra : {" --tp 2 --backend ring --grad-accum 2", " --tp 2 --sequence-parallel --amp fp16"}) {
    SCOPED_TRACE(extra);
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) { return run(2, flags(steps) + extra + args); }, path("a"), path("b"));
  }
}

// Resharding across tensor-parallel sizes. The tp 2 checkpoint holds what one process holds at the same step (each
// tensor within 1e-3 of its largest element: q/k/v in their ranges, the vocabulary's padding rows dropped), and it
// continues at tp 1, tp 4 and tp 2 x dp 2 to the run that never stopped, within kF32SumOrder; a one-process
// checkpoint continues at tp 2.
TEST_F(ResumeParallel, TensorParallelCheckpointResumesAtAnotherTp) {
  Result straight = run(1, flags(8) + " --checkpoint-dir " + path("one") + " --save-every 4");
  ASSERT_EQ(straight.code, 0) << straight.out;
  ASSERT_EQ(run(2, flags(8) + " --tp 2 --checkpoint-dir " + path("tp2") + " --save-every 4").code, 0);
  for (const char* f : {"model", "optimizer"})
    EXPECT_LT(max_relative_difference(path("tp2") + "/step-00000004", path("one") + "/step-00000004", f), 1e-3) << f;
  // Each rank wrote its own share of AdamW's state (tensors_of checked that no tensor is in both; the comparison
  // above, that together they hold every one); a missing share is refused by name.
  const auto files = safetensors_files(path("tp2") + "/step-00000004");
  EXPECT_TRUE(files.count("optimizer-00000-of-00002.safetensors") &&
              files.count("optimizer-00001-of-00002.safetensors"));
  fs::copy(path("tp2") + "/step-00000004", path("missing"), fs::copy_options::recursive);
  fs::remove(path("missing") + "/optimizer-00001-of-00002.safetensors");
  Result missing = run(2, flags(8) + " --tp 2 --resume " + path("missing"));
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("missing file optimizer-00001-of-00002.safetensors"), std::string::npos) << missing.out;
  for (Resharded c : {Resharded{"tp2", 1, ""}, Resharded{"tp2", 4, " --tp 4"}, Resharded{"tp2", 4, " --tp 2 --dp 2"},
                      Resharded{"one", 2, " --tp 2"}})
    expect_resumes_close_to(c, straight);
}

// The consolidated --save of a tp 2 run is a one-process file: tp 4 evaluates it (--init-from, --steps 0) to the
// validation loss the tp 2 run printed, and PyTorch (scripts/load_in_pytorch.py, when /usr/bin/python3 has torch)
// computes the same loss from it.
TEST_F(ResumeParallel, TensorParallelSaveLoadsAtTp4AndInPyTorch) {
  Result two = run(2, flags(8) + " --tp 2 --save " + path("tp2.safetensors"));
  ASSERT_EQ(two.code, 0) << two.out;
  Result four = run(4, flags(0) + " --tp 4 --init-from " + path("tp2.safetensors"));
  ASSERT_EQ(four.code, 0) << four.out;
  EXPECT_TRUE(losses_agree(summary(four.out, "val_loss"), summary(two.out, "val_loss"), kF32SumOrder)) << four.out;

  if (minidl::testing::run_program("/usr/bin/python3 -c 'import torch'").code != 0)
    GTEST_SKIP() << "/usr/bin/python3 has no torch: the PyTorch load of the tp 2 file is not checked (PyTorch is "
                    "never a test dependency)";
  Result torch =
      minidl::testing::run_program("/usr/bin/python3 " + std::string(SOURCE_DIR) + "/scripts/load_in_pytorch.py " +
                                   path("tp2.safetensors") + " --data " + path("tiny.txt") + " --seq 16 --windows 4");
  ASSERT_EQ(torch.code, 0) << torch.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(torch.out, m, std::regex("val_loss=([-0-9.e+naif]+)"))) << torch.out;
  // PyTorch's own kernels sum in their own order, in f32 as ours.
  EXPECT_TRUE(losses_agree(std::stod(m[1]), summary(two.out, "val_loss"), kF32SumOrder)) << torch.out;
}

// pp 2: 8 steps straight vs 4 + resume + 4 give byte-identical checkpoints (each stage's tensors gathered into the
// one-process file, the tied wte once), with GPipe over 4 micro-batches, and at dp 2 x pp 2 with the fp16 scaler.
TEST_F(ResumeParallel, PipelineStraightEqualsFourPlusFour) {
  struct Case {
    int ranks;
    const char* extra;
  };
  for (Case c : {Case{2, " --pp 2 --micro-batches 4 --schedule gpipe"}, Case{4, " --pp 2 --dp 2 --amp fp16"}}) {
    SCOPED_TRACE(c.extra);
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) { return run(c.ranks, flags(steps) + c.extra + args); }, path("a"),
        path("b"));
  }
}

// Resharding across pipeline sizes: the pp 2 checkpoint holds what one process holds at the same step (within 1e-3
// of each tensor's largest element; wte's two contributions are summed in another order), and it continues at pp 1,
// at dp 2 x pp 2 and at tp 2 to the run that never stopped within kF32SumOrder; a one-process checkpoint continues
// at pp 2.
TEST_F(ResumeParallel, PipelineCheckpointResumesAtAnotherPp) {
  Result straight = run(1, flags(8) + " --checkpoint-dir " + path("one") + " --save-every 4");
  ASSERT_EQ(straight.code, 0) << straight.out;
  ASSERT_EQ(run(2, flags(8) + " --pp 2 --checkpoint-dir " + path("pp2") + " --save-every 4").code, 0);
  for (const char* f : {"model", "optimizer"})
    EXPECT_LT(max_relative_difference(path("pp2") + "/step-00000004", path("one") + "/step-00000004", f), 1e-3) << f;
  for (Resharded c : {Resharded{"pp2", 1, ""}, Resharded{"pp2", 4, " --pp 2 --dp 2"}, Resharded{"pp2", 2, " --tp 2"},
                      Resharded{"one", 2, " --pp 2"}})
    expect_resumes_close_to(c, straight);
}

// --save, --init-from and --sample at pp 2: the saved file is a one-process model (one process evaluates it to the
// pp run's validation loss and samples the same text from it); --init-from at pp 2 (interleaved, 2 chunks per rank)
// loads it back to the same loss.
TEST_F(ResumeParallel, PipelineSaveInitFromAndSample) {
  Result two = run(2, flags(8) + " --pp 2 --save " + path("pp2.safetensors") + " --sample 40");
  ASSERT_EQ(two.code, 0) << two.out;
  auto sample_of = [](const std::string& out) {
    const size_t a = out.find("---- sample ----\n"), b = out.find("\n----------------");
    return a == std::string::npos || b == std::string::npos ? std::string("missing") : out.substr(a, b - a);
  };
  Result one = run(1, flags(0) + " --init-from " + path("pp2.safetensors") + " --sample 40");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_TRUE(losses_agree(summary(one.out, "val_loss"), summary(two.out, "val_loss"), kF32SumOrder)) << one.out;
  EXPECT_NE(sample_of(two.out), "missing") << two.out;
  EXPECT_EQ(sample_of(one.out), sample_of(two.out));
  // Interleaved: rank r holds chunks r and r + 2 of 4, each loading its blocks of a 4-layer model.
  auto four_layers = [](std::string f) { return f.replace(f.find("--layers 2"), 10, "--layers 4"); };
  Result saved = run(1, four_layers(flags(4)) + " --save " + path("l4.safetensors"));
  ASSERT_EQ(saved.code, 0) << saved.out;
  Result interleaved = run(2, four_layers(flags(0)) + " --init-from " + path("l4.safetensors") +
                                  " --pp 2 --schedule interleaved --virtual-stages 2");
  ASSERT_EQ(interleaved.code, 0) << interleaved.out;
  EXPECT_TRUE(losses_agree(summary(interleaved.out, "val_loss"), summary(saved.out, "val_loss"), kF32SumOrder))
      << interleaved.out;
}

// tp 2 x pp 2 (4 ranks): 8 steps straight vs 4 + resume + 4 give byte-identical checkpoints (each stage's tp slices
// gathered into whole tensors, then the stages' tensors into the one-process file; AdamW's moments written by the
// four ranks, a share each).
TEST_F(ResumeParallel, TensorAndPipelineStraightEqualsFourPlusFour) {
  minidl::testing::expect_straight_equals_four_plus_four(
      [&](int steps, const std::string& args) { return run(4, flags(steps) + " --tp 2 --pp 2" + args); }, path("a"),
      path("b"));
}

// Resharding tp 2 x pp 2: its step-4 checkpoint holds what one process holds at the same step (tensor by tensor
// within 1e-3 of its largest element: q/k/v in their ranges, the vocabulary's padding dropped, wte once) and
// continues in one process to the run that never stopped within kF32SumOrder; a one-process checkpoint continues at
// tp 2 x pp 2.
TEST_F(ResumeParallel, TensorAndPipelineCheckpointResumesInOneProcess) {
  Result straight = run(1, flags(8) + " --checkpoint-dir " + path("one") + " --save-every 4");
  ASSERT_EQ(straight.code, 0) << straight.out;
  Result split = run(4, flags(8) + " --tp 2 --pp 2 --checkpoint-dir " + path("tp2pp2") + " --save-every 4");
  ASSERT_EQ(split.code, 0) << split.out;
  for (const char* f : {"model", "optimizer"})
    EXPECT_LT(max_relative_difference(path("tp2pp2") + "/step-00000004", path("one") + "/step-00000004", f), 1e-3) << f;
  EXPECT_EQ(safetensors_files(path("tp2pp2") + "/step-00000004").count("optimizer-00003-of-00004.safetensors"), 1u);
  for (Resharded c : {Resharded{"tp2pp2", 1, ""}, Resharded{"one", 4, " --tp 2 --pp 2"}})
    expect_resumes_close_to(c, straight);
}

// --save, --init-from and --sample at tp 2 x pp 2: the saved file is a one-process model (one process evaluates it
// to the split run's validation loss and samples the same text from it, which the split run printed), and
// --init-from at tp 2 x pp 2 loads it back to the same loss. A file without one of the tensors is refused at --pp 2,
// naming the file and the tensor.
TEST_F(ResumeParallel, TensorAndPipelineSaveInitFromAndSample) {
  Result split = run(4, flags(8) + " --tp 2 --pp 2 --save " + path("tp2pp2.safetensors") + " --sample 40");
  ASSERT_EQ(split.code, 0) << split.out;
  auto sample_of = [](const std::string& out) {
    const size_t a = out.find("---- sample ----\n"), b = out.find("\n----------------");
    return a == std::string::npos || b == std::string::npos ? std::string("missing") : out.substr(a, b - a);
  };
  Result one = run(1, flags(0) + " --init-from " + path("tp2pp2.safetensors") + " --sample 40");
  ASSERT_EQ(one.code, 0) << one.out;
  EXPECT_TRUE(losses_agree(summary(one.out, "val_loss"), summary(split.out, "val_loss"), kF32SumOrder)) << one.out;
  EXPECT_NE(sample_of(split.out), "missing") << split.out;
  EXPECT_EQ(sample_of(one.out), sample_of(split.out));
  Result again = run(4, flags(0) + " --tp 2 --pp 2 --init-from " + path("tp2pp2.safetensors"));
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(losses_agree(summary(again.out, "val_loss"), summary(split.out, "val_loss"), kF32SumOrder)) << again.out;

  minidl::nn::SafetensorsFile file = minidl::nn::load_safetensors(path("tp2pp2.safetensors"));
  ASSERT_EQ(file.tensors.erase("transformer.h.1.mlp.c_fc.weight"), 1u);  // a block of the second stage
  minidl::nn::save_safetensors(path("holed.safetensors"),
                               minidl::nn::NamedTensors(file.tensors.begin(), file.tensors.end()), file.metadata);
  Result holed = run(2, flags(2) + " --pp 2 --init-from " + path("holed.safetensors"));
  EXPECT_EQ(holed.code, 2) << holed.out;
  EXPECT_NE(holed.out.find(path("holed.safetensors")), std::string::npos) << holed.out;
  EXPECT_NE(holed.out.find("transformer.h.1.mlp.c_fc.weight"), std::string::npos) << holed.out;
}

// pp 2 x dp 2 with ZeRO 1 (and ZeRO 2 with the fp16 scaler): each stage's AdamW shards are all-gathered over its dp
// group into logical tensors; 8 steps straight vs 4 + resume + 4 give byte-identical checkpoints.
TEST_F(ResumeParallel, PipelineZeroStraightEqualsFourPlusFour) {
  for (const char* extra : {" --pp 2 --dp 2 --zero 1", " --pp 2 --dp 2 --zero 2 --amp fp16"}) {
    SCOPED_TRACE(extra);
    minidl::testing::expect_straight_equals_four_plus_four(
        [&](int steps, const std::string& args) { return run(4, flags(steps) + extra + args); }, path("a"), path("b"));
  }
}

// Resharding pp 2 x dp 2 x ZeRO 1: its step-4 checkpoint holds what one process holds (tensor by tensor within
// 1e-3), continues in one process to the run that never stopped within kF32SumOrder, and a one-process checkpoint
// continues at pp 2 x dp 2 x ZeRO 1 (each rank taking its shard of its stage's tensors).
TEST_F(ResumeParallel, PipelineZeroCheckpointResumesInOneProcess) {
  Result straight = run(1, flags(8) + " --checkpoint-dir " + path("one") + " --save-every 4");
  ASSERT_EQ(straight.code, 0) << straight.out;
  Result zero = run(4, flags(8) + " --pp 2 --dp 2 --zero 1 --checkpoint-dir " + path("ppzero") + " --save-every 4");
  ASSERT_EQ(zero.code, 0) << zero.out;
  for (const char* f : {"model", "optimizer"})
    EXPECT_LT(max_relative_difference(path("ppzero") + "/step-00000004", path("one") + "/step-00000004", f), 1e-3) << f;
  for (Resharded c : {Resharded{"ppzero", 1, ""}, Resharded{"one", 4, " --pp 2 --dp 2 --zero 1"}})
    expect_resumes_close_to(c, straight);
}

// The Llama model (nn/llama.h: GQA 4:2, an untied head) through the same checkpoints: tp 2 x pp 2 stopped at step 4
// and resumed is byte for byte the run that never stopped; its step-4 checkpoint continues in one process, and one
// process's at tp 2 x pp 2, to that run's validation loss within kF32SumOrder. ZeRO 1, 2 and 3 over dp 2 print
// DDP's 6 losses bit for bit (--loss-log).
TEST_F(ResumeParallel, LlamaResumesAndReshardsAndZeroEqualsDdp) {
  const std::string llama = " --model llama --kv-heads 2 --untie";
  minidl::testing::expect_straight_equals_four_plus_four(
      [&](int steps, const std::string& args) { return run(4, flags(steps) + llama + " --tp 2 --pp 2" + args); },
      path("a"), path("b"));
  Result straight = run(1, flags(8) + llama + " --checkpoint-dir " + path("one") + " --save-every 4");
  ASSERT_EQ(straight.code, 0) << straight.out;
  ASSERT_EQ(run(4, flags(8) + llama + " --tp 2 --pp 2 --checkpoint-dir " + path("tp2pp2") + " --save-every 4").code, 0);
  const std::string one = llama, split = llama + " --tp 2 --pp 2";
  for (Resharded c : {Resharded{"tp2pp2", 1, one.c_str()}, Resharded{"one", 4, split.c_str()}})
    expect_resumes_close_to(c, straight);
  auto losses = [&](int zero) {
    const std::string log = path("zero" + std::to_string(zero) + ".losses");
    Result r = run(2, flags(6) + llama + " --zero " + std::to_string(zero) + " --loss-log " + log);
    EXPECT_EQ(r.code, 0) << r.out;
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::string ddp = losses(0);
  EXPECT_EQ(std::count(ddp.begin(), ddp.end(), '\n'), 6) << ddp;
  for (int zero : {1, 2, 3}) EXPECT_EQ(losses(zero), ddp) << "--zero " << zero;
}
