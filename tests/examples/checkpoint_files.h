// Helpers of the checkpoint tests (test_resume.cpp, test_resume_parallel.cpp): the mpiexec prefix of a run, a
// checkpoint directory's files compared byte for byte (the safetensors and state.json), and the
// straight-versus-resumed oracle.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include <unistd.h>

#include "support/run_program.h"

namespace minidl::testing {

// "" for one process, else MPIEXEC -n n (oversubscribed: the tests run more ranks than cores).
inline std::string mpiexec(int n) {
  return n == 1 ? "" : std::string(MPIEXEC) + " -n " + std::to_string(n) + " --oversubscribe --allow-run-as-root ";
}

// A fresh directory for the running test (under the temporary directory, named by `prefix`, the pid and the
// test), holding tiny.txt: 200 times "the quick brown fox. " (17 distinct bytes).
inline std::filesystem::path fresh_test_dir(const std::string& prefix) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      (prefix + std::to_string(::getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the quick brown fox. ";
  std::ofstream(dir / "tiny.txt") << text;
  return dir;
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

// Which part of state.json two checkpoints must share: all of it, or all but the run's configuration (two layouts
// of one run: ZeRO against DDP, another data-parallel size).
enum class RunConfig { kSame, kMayDiffer };

// Byte for byte the same model and optimizer files (the same names too) and config.json, and the same state.json:
// the step, the schedule's and the optimizer's step counts, the loss scaler's state (scale, clean and skipped
// steps, hysteresis) and, unless `config` says it may differ, the run's configuration (but for the checkpoints'
// folder and interval). False, saying what differs, when there is no model file or anything differs.
// A replicated checkpoint (train/checkpoint.h: replica-K/ directories and DiLoCo's outer files) is the same when
// every replica's is and the outer files are.
inline ::testing::AssertionResult same_files(const std::string& a, const std::string& b,
                                             RunConfig config = RunConfig::kSame) {
  const auto fa = safetensors_files(a), fb = safetensors_files(b);
  if (std::filesystem::is_directory(std::filesystem::path(a) / "replica-00000")) {
    auto replica = [](int r) {
      char name[32];
      std::snprintf(name, sizeof name, "/replica-%05d", r);
      return std::string(name);
    };
    int replicas = 0;
    for (; std::filesystem::is_directory(a + replica(replicas)); ++replicas)
      if (auto same = same_files(a + replica(replicas), b + replica(replicas), config); !same) return same;
    if (std::filesystem::is_directory(b + replica(replicas)))
      return ::testing::AssertionFailure() << b << " holds more replicas than " << a << "'s " << replicas;
    if (fa != fb) return ::testing::AssertionFailure() << "the outer files of " << a << " and " << b << " differ";
    return ::testing::AssertionSuccess();
  }
  if (!fa.count("model.safetensors") || fa.size() < 2) return ::testing::AssertionFailure() << a << " has no model";
  if (fa != fb) {
    auto fail = ::testing::AssertionFailure() << "the safetensors files of " << a << " and " << b << " differ:";
    for (const auto& [name, bytes] : fa)
      if (!fb.count(name) || fb.at(name) != bytes) fail << " " << name;
    for (const auto& [name, bytes] : fb)
      if (!fa.count(name)) fail << " " << name << " (only in " << b << ")";
    return fail;
  }
  // config.json: transformers' config, where it has the model (a mixture of experts Mixtral cannot express has none)
  const bool ha = std::filesystem::exists(std::filesystem::path(a) / "config.json"),
             hb = std::filesystem::exists(std::filesystem::path(b) / "config.json");
  const std::string ca = ha ? read_file(std::filesystem::path(a) / "config.json") : "",
                    cb = hb ? read_file(std::filesystem::path(b) / "config.json") : "";
  if (ha != hb || (ha && (ca.empty() || ca != cb)))
    return ::testing::AssertionFailure() << "config.json differs:\n" << ca << "\n" << cb;
  nlohmann::json sa, sb;
  try {
    sa = nlohmann::json::parse(read_file(std::filesystem::path(a) / "state.json"));
    sb = nlohmann::json::parse(read_file(std::filesystem::path(b) / "state.json"));
  } catch (const nlohmann::json::exception& e) {
    return ::testing::AssertionFailure() << "state.json of " << a << " or " << b << " unreadable: " << e.what();
  }
  if (config == RunConfig::kMayDiffer) {
    sa.erase("run_config");
    sb.erase("run_config");
  } else {
    // Where and how often the runs wrote their checkpoints: what the straight-versus-resumed oracle varies.
    for (nlohmann::json* s : {&sa, &sb})
      if (s->contains("run_config"))
        for (const char* key : {"checkpoint_dir", "save_every"}) (*s)["run_config"].erase(key);
  }
  if (sa != sb)
    return ::testing::AssertionFailure() << "state.json differs:\n"
                                         << a << ":\n"
                                         << sa.dump(2) << "\n"
                                         << b << ":\n"
                                         << sb.dump(2);
  return ::testing::AssertionSuccess();
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
