// minidl's kernels declare static shared memory with MINIDL_SHARED, never a raw __shared__: under the emulator
// a raw one is a thread_local that keeps the previous block's values, so a read of what no thread of the block
// wrote would go unnoticed (cuda_compat.h). This test reads the kernel sources and names every offender.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace emu_test {
namespace {

// `source` with comments blanked out (newlines kept, so line numbers stay right).
std::string without_comments(const std::string& source) {
  std::string out = source;
  for (size_t i = 0; i + 1 < out.size(); ++i) {
    if (out[i] == '/' && out[i + 1] == '/') {
      for (; i < out.size() && out[i] != '\n'; ++i) out[i] = ' ';
    } else if (out[i] == '/' && out[i + 1] == '*') {
      for (; i < out.size() && !(out[i] == '*' && i + 1 < out.size() && out[i + 1] == '/'); ++i)
        if (out[i] != '\n') out[i] = ' ';
      if (i + 1 < out.size()) out[i] = out[i + 1] = ' ';
    }
  }
  return out;
}

// "file:line: text" for each line of a .cu file under `folders` that uses __shared__ outside a comment.
std::vector<std::string> raw_shared_uses(const std::vector<std::string>& folders) {
  std::vector<std::string> found;
  for (const std::string& folder : folders) {
    const std::filesystem::path dir = std::filesystem::path(MINIDL_SOURCE_DIR) / folder;
    EXPECT_TRUE(std::filesystem::is_directory(dir)) << dir;
    if (!std::filesystem::is_directory(dir)) continue;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".cu") continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      std::istringstream lines(without_comments(text.str()));
      std::string line;
      for (int number = 1; std::getline(lines, line); ++number)
        if (line.find("__shared__") != std::string::npos)
          found.push_back(folder + "/" + entry.path().filename().string() + ":" + std::to_string(number) + ": " + line);
    }
  }
  return found;
}

TEST(KernelSources, UseMinidlSharedNotRawShared) {
  for (const std::string& use : raw_shared_uses({"ops/cuda", "dist/cuda"}))
    ADD_FAILURE() << use
                  << "\n  declare it with MINIDL_SHARED(type, name, [dims]) (cuda_emu/cuda_compat.h), or use "
                     "dynamic_smem<T>() instead of extern __shared__";
}

TEST(KernelSources, CommentsDoNotCount) {
  EXPECT_EQ(without_comments("a // __shared__\n/* __shared__\n */ b"), "a              \n             \n    b");
}

}  // namespace
}  // namespace emu_test
