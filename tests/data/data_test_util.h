// Helpers for the data tests: the corpus path, a scratch directory, and error-message checks.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace minidl::testing {

// tinyshakespeare.txt in $MINIDL_DATA_DIR (CTest sets it, see tests/CMakeLists.txt), else in the configured
// MINIDL_DATA_DIR (by default the repository's data/, where the corpus ships).
inline std::string corpus_path() {
  const char* dir = std::getenv("MINIDL_DATA_DIR");
  return std::string(dir ? dir : MINIDL_TEST_DATA_DIR) + "/tinyshakespeare.txt";
}

// A fresh directory under the system temp dir, removed with everything in it when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = std::filesystem::temp_directory_path() /
            ("minidl_" + std::string(info->name()) + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `contents` to a file in the directory and returns its path.
  std::string write(const std::string& name, const std::string& contents) const {
    std::filesystem::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << contents;
    return p.string();
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs fn, expecting a minidl::Error whose message contains every one of `parts`.
template <class Fn, class... Parts>
void expect_error_containing(Fn&& fn, const Parts&... parts) {
  try {
    fn();
    ADD_FAILURE() << "expected a minidl::Error";
  } catch (const Error& e) {
    std::string msg = e.what();
    for (std::string part : {std::string(parts)...})
      EXPECT_NE(msg.find(part), std::string::npos) << "message \"" << msg << "\" lacks \"" << part << "\"";
  }
}

}  // namespace minidl::testing
