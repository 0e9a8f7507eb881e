// Helpers of the checkpoint tests (test_resume.cpp, test_resume_parallel.cpp): the mpiexec prefix of a run, a
// checkpoint directory's safetensors files compared byte for byte, and the straight-versus-resumed oracle.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <string>

#include "support/run_program.h"

namespace minidl::testing {

// "" for one process, else MPIEXEC -n n (oversubscribed: the tests run more ranks than cores).
inline std::string mpiexec(int n) {
  return n == 1 ? "" : std::string(MPIEXEC) + " -n " + std::to_string(n) + " --oversubscribe --allow-run-as-root ";
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every safetensors file of a checkpoint directory by name: the model and the optimizer's files (one per writing
// rank: optimizer.safetensors, or optimizer-00000-of-00002.safetensors, ...).
inline std::map<std::string, std::string> safetensors_files(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files[e.path().filename().string()] = read_file(e.path());
  return files;
}

// Byte for byte the same model and optimizer files (the same names too); false when there is no model file.
inline bool same_files(const std::string& a, const std::string& b) {
  const auto fa = safetensors_files(a);
  return fa.count("model.safetensors") && fa.size() >= 2 && fa == safetensors_files(b);
}

// The value of `key` on the summary line, as printed ("missing" if absent).
inline std::string summary_text(const std::string& out, const std::string& key) {
  std::smatch m;
  return std::regex_search(out, m, std::regex("summary: .*" + key + "=([-0-9.e+naif]+)")) ? m[1].str() : "missing";
}

// 8 steps straight into dir a, against 4 steps into dir b, a stop, and 4 more resumed from b's step-4 checkpoint:
// the final checkpoints' files are byte for byte the same, and so are the validation loss and the loss scale.
// run(steps, args) runs train_gpt for `steps` steps with `args` appended.
template <class Run>
void expect_straight_equals_four_plus_four(const Run& run, const std::string& a, const std::string& b) {
  std::filesystem::remove_all(a);
  std::filesystem::remove_all(b);
  ProgramResult straight = run(8, " --checkpoint-dir " + a + " --save-every 8");
  ASSERT_EQ(straight.code, 0) << straight.out;
  ProgramResult first = run(8, " --checkpoint-dir " + b + " --save-every 4");
  ASSERT_EQ(first.code, 0) << first.out;
  std::filesystem::remove_all(b + "/step-00000008");
  ProgramResult second = run(8, " --checkpoint-dir " + b + " --save-every 4 --resume auto");
  ASSERT_EQ(second.code, 0) << second.out;
  EXPECT_NE(second.out.find("resuming from " + b + "/step-00000004"), std::string::npos) << second.out;
  EXPECT_TRUE(same_files(a + "/step-00000008", b + "/step-00000008"));
  EXPECT_EQ(summary_text(second.out, "val_loss"), summary_text(straight.out, "val_loss"));
  EXPECT_EQ(summary_text(second.out, "loss_scale"), summary_text(straight.out, "loss_scale"));
}

}  // namespace minidl::testing
