// Helpers shared by the nn tests: a scratch directory and an "it throws, and the message says ..." check.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace minidl::testing {

// A fresh directory under the system temp dir, removed with everything in it when the object goes away.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("minidl_" + std::string(info->test_suite_name()) + "_" + info->name() + "_" + std::to_string(getpid()));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

// Expects fn to throw minidl::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a minidl::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

// (B, T) token ids in [0, V), element i from Philox(seed, stream): a batch any test can rebuild.
inline Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed, uint64_t stream) {
  std::vector<int32_t> v(size_t(B * T));
  Philox rng(seed, stream);
  for (size_t i = 0; i < v.size(); ++i) v[i] = int32_t(rng.draw(i).x % uint32_t(V));
  return Tensor::from_vector(v, {B, T});
}

}  // namespace minidl::testing
