// The train_cnn program end to end: a small run on the CPU learns to tell three shapes apart well above chance
// (1/3), and bad input gives exit code 2 with a message naming what was expected and what was found.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>

#include "support/run_program.h"

namespace {

using Result = minidl::testing::ProgramResult;

Result run(const std::string& args) { return minidl::testing::run_program(std::string(TRAIN_CNN_BIN) + " " + args); }

// The value of `key=` on the summary line.
double summary_value(const std::string& out, const std::string& key) {
  std::smatch m;
  std::regex re("summary: .*\\b" + key + "=([0-9.eE+-]+)");
  if (!std::regex_search(out, m, re)) {
    ADD_FAILURE() << "no " << key << " on a summary line in:\n" << out;
    return -1;
  }
  return std::stod(m[1]);
}

}  // namespace

TEST(TrainCnn, LearnsThreeShapesWellAboveChance) {
  Result r =
      run("--classes 3 --image-size 16 --steps 250 --batch 32 --noise 0.05 --train-size 2048 "
          "--test-size 512 --seed 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("epoch 1 | step 64/250"), std::string::npos) << r.out;
  EXPECT_EQ(summary_value(r.out, "steps"), 250);
  EXPECT_GE(summary_value(r.out, "test_acc"), 0.9) << r.out;
  EXPECT_GE(summary_value(r.out, "train_acc"), 0.9) << r.out;
  EXPECT_LT(summary_value(r.out, "train_loss"), 0.4) << r.out;
  EXPECT_GT(summary_value(r.out, "ms_per_step"), 0) << r.out;
}

// In the emulated CUDA build, --device cuda (cuDNN's place taken by the CPU conv on emulated device memory, every
// other op a CUDA kernel) trains the same network to the same losses and accuracies as the CPU.
TEST(TrainCnn, EmulatedCudaTrainsLikeTheCpu) {
  if (std::string(TRAIN_CNN_CUDA) != "emulated") GTEST_SKIP() << "train_cnn is not built with MINIDL_CUDA_EMULATION";
  const std::string flags = "--classes 3 --image-size 16 --steps 40 --batch 16 --train-size 512 --test-size 128";
  Result cpu = run(flags + " --device cpu"), cuda = run(flags + " --device cuda");
  ASSERT_EQ(cpu.code, 0) << cpu.out;
  ASSERT_EQ(cuda.code, 0) << cuda.out;
  EXPECT_NEAR(summary_value(cuda.out, "train_loss"), summary_value(cpu.out, "train_loss"),
              1e-3 * summary_value(cpu.out, "train_loss"));
  EXPECT_NEAR(summary_value(cuda.out, "test_acc"), summary_value(cpu.out, "test_acc"), 1.0 / 128);
}

TEST(TrainCnn, BadInputExitsWithTwoAndSaysWhatWasExpected) {
  struct Case {
    const char* args;
    const char* says;
  };
  for (const Case& c : {Case{"--classes 7", "--classes: expected 2 to 4 (circle, square, triangle, cross), got 7"},
                        Case{"--device tpu", "--device: expected cpu, cuda or cuda:N, got 'tpu'"},
                        Case{"--batch 0", "--batch: expected at least 1, got 0"},
                        Case{"--image-size 8", "--image-size: expected 16 to 128 pixels, got 8"},
                        Case{"--lr -1", "--lr: expected a positive number, got -1"},
                        Case{"--train-size 10 --batch 64", "--train-size: expected at least one batch (--batch 64)"},
                        Case{"--steps abc", "--steps"}, Case{"--no-such-flag", "--no-such-flag"}}) {
    Result r = run(c.args);
    EXPECT_EQ(r.code, 2) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find("train_cnn: error: "), std::string::npos) << c.args << "\n" << r.out;
    EXPECT_NE(r.out.find(c.says), std::string::npos) << c.args << "\n" << r.out;
  }
}

// Without a CUDA backend in the build, --device cuda says how to get one; with one, the device path is tested
// by the ops' device tests (tests/ops/test_conv_device.cpp).
TEST(TrainCnn, CudaWithoutABackendSaysHowToGetOne) {
  if (TRAIN_CNN_HAS_CUDA_BACKEND) GTEST_SKIP() << "this build links a CUDA backend into train_cnn";
  Result r = run("--device cuda");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("this program has no CUDA backend (a build with nvcc"), std::string::npos) << r.out;
}

TEST(TrainCnn, HelpExplainsEveryFlag) {
  Result r = run("--help");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* flag : {"--device", "--steps", "--batch", "--lr", "--seed", "--image-size", "--classes", "--noise",
                           "--width", "--train-size", "--test-size", "--threads", "--weight-decay"})
    EXPECT_NE(r.out.find(flag), std::string::npos) << flag << " missing from:\n" << r.out;
}
