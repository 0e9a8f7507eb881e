// The programs of docs/library.md (examples/library/), run as a user runs them: the MLP learns in one process; under
// DDP and under ZeRO 1, 2 and 3 at 2 ranks it prints the one-process losses (to float rounding: the ranks' halves of
// the batch are averaged in another order), and the four print the same bits; a train_gpt checkpoint evaluated by a
// program of one's own gives train_gpt's validation loss; and that program, which uses the training layer on the CPU,
// links no CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <unistd.h>

#include "support/run_program.h"

namespace fs = std::filesystem;
using minidl::testing::run_program;

namespace {

std::string mpiexec(int n) {
  return std::string(MPIEXEC) + " -n " + std::to_string(n) + " --oversubscribe --allow-run-as-root ";
}

// The number after `key` in `out` (e.g. "final loss 0.0123"), NaN if absent.
double field(const std::string& out, const std::string& key) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(key + " ([-+0-9.eE]+|nan)"))) return NAN;
  return std::stod(m[1]);
}

}  // namespace

TEST(Library, MlpLearnsAndDataParallelModesPrintItsLosses) {
  auto one = run_program(EXAMPLE_MLP);
  ASSERT_EQ(one.code, 0) << one.out;
  const double first = field(one.out, "step 50: loss"), last = field(one.out, "final loss");
  // Default-initialised layers learn: the loss after 200 steps is a small fraction of the loss at step 50.
  EXPECT_LT(last, 0.25 * first) << one.out;
  std::string ddp_final;
  for (const std::string& mode : {std::string(EXAMPLE_MLP_DDP), std::string(EXAMPLE_MLP_ZERO) + " 1",
                                  std::string(EXAMPLE_MLP_ZERO) + " 2", std::string(EXAMPLE_MLP_ZERO) + " 3"}) {
    SCOPED_TRACE(mode);
    auto two = run_program(mpiexec(2) + mode);
    ASSERT_EQ(two.code, 0) << two.out;
    // Float rounding (each rank's half of the batch is averaged after its own sums), grown by 200 AdamW steps to
    // about 1e-4 of the final loss.
    for (const char* key : {"step 50: loss", "step 100: loss", "final loss"})
      EXPECT_NEAR(field(two.out, key), field(one.out, key), 1e-3 * field(one.out, key)) << key << "\n" << two.out;
    // Between them the same bits: at 2 ranks an average is one exact sum of two halved, whichever collective makes it.
    std::smatch mine, ddp;
    ASSERT_TRUE(std::regex_search(two.out, mine, std::regex("final loss (\\S+)")));
    if (mode == EXAMPLE_MLP_DDP) ddp_final = mine[1];
    EXPECT_EQ(mine[1], ddp_final) << "ZeRO's final loss is not DDP's";
  }
}

TEST(Library, CheckpointEvaluatesToTrainGptsValidationLoss) {
  const fs::path dir = fs::temp_directory_path() / ("minidl_library_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream corpus(dir / "tiny.txt");
    for (int i = 0; i < 300; ++i) corpus << "the quick brown fox jumps. ";
  }
  const std::string ck = (dir / "model.safetensors").string(), corpus = (dir / "tiny.txt").string();
  auto train = run_program(std::string(TRAIN_GPT_BIN) + " --data " + corpus +
                           " --layers 1 --heads 2 --embd 16 --seq 16 --batch 4 --threads 1 --steps 30 --eval-windows 8 "
                           "--log-every 1000 --save " +
                           ck);
  ASSERT_EQ(train.code, 0) << train.out;
  auto eval = run_program(std::string(EXAMPLE_EVALUATE) + " " + ck + " " + corpus + " 8 4");
  ASSERT_EQ(eval.code, 0) << eval.out;
  // The same windows, the same model, the same evaluation: the same bits (both print 9 significant digits).
  std::smatch want, got;
  ASSERT_TRUE(std::regex_search(train.out, want, std::regex("val_loss=([0-9.]+)"))) << train.out;
  ASSERT_TRUE(std::regex_search(eval.out, got, std::regex("val_loss ([0-9.]+)"))) << eval.out;
  EXPECT_EQ(got[1], want[1]) << eval.out;
  EXPECT_GT(eval.out.size(), got.position(0) + 100) << "no sample after the loss: " << eval.out;
  // A missing checkpoint: a message naming it, exit 2.
  auto missing = run_program(std::string(EXAMPLE_EVALUATE) + " " + (dir / "nope.safetensors").string() + " " + corpus);
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_NE(missing.out.find("nope.safetensors"), std::string::npos) << missing.out;
  // A count that is not one, and a ZeRO stage that does not exist: exit 2 naming the argument and what was given.
  auto bad_count = run_program(std::string(EXAMPLE_EVALUATE) + " " + ck + " " + corpus + " eight");
  EXPECT_EQ(bad_count.code, 2) << bad_count.out;
  EXPECT_NE(bad_count.out.find("WINDOWS: expected a positive integer, got 'eight'"), std::string::npos)
      << bad_count.out;
  auto bad_stage = run_program(std::string(EXAMPLE_MLP_ZERO) + " 4");
  EXPECT_EQ(bad_stage.code, 2) << bad_stage.out;
  EXPECT_NE(bad_stage.out.find("expected a ZeRO stage 1, 2 or 3, got '4'"), std::string::npos) << bad_stage.out;
  fs::remove_all(dir);
}

// The training layer reaches a device only through core's hook table: a CPU program that uses it carries no CUDA
// backend (before, minidl_train linked the build's backend into every program: 21 MB for a CPU-only one).
TEST(Library, CpuProgramUsingTheTrainingLayerLinksNoCuda) {
  auto symbols = run_program("nm -C " + std::string(EXAMPLE_EVALUATE) + " | grep -c 'minidl::cuda::' || true");
  EXPECT_EQ(std::stoi(symbols.out), 0) << "CUDA backend symbols in a CPU-only program";
  auto train_gpt = run_program("nm -C " + std::string(TRAIN_GPT_BIN) + " | grep -c 'minidl::cuda::' || true");
  if (std::string(TRAIN_GPT_CUDA) != "none") EXPECT_GT(std::stoi(train_gpt.out), 0) << "the check sees nothing";
}

// OpenMP's spin setting is the programs' choice (core/openmp_spin.cpp, linked by minidl's programs): train_gpt
// re-executes itself at start from its .preinit_array entry, a program of one's own that links only the library has
// no such entry (the entry's symbol, not the section: AddressSanitizer's runtime puts one of its own there).
TEST(Library, OnlyMinidlsProgramsReExecuteForOpenMP) {
  auto entries = [](const std::string& binary) {
    auto r = run_program("nm -C " + binary + " | grep -c 'minidl::preinit_openmp_spin' || true");
    return std::stoi(r.out);
  };
  EXPECT_EQ(entries(EXAMPLE_MLP), 0);
  EXPECT_EQ(entries(EXAMPLE_EVALUATE), 0);
  EXPECT_EQ(entries(TRAIN_GPT_BIN), 1) << "the check sees nothing";
}
