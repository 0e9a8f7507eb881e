// Helpers of the checkpoint tests (test_resume.cpp, test_resume_parallel.cpp): the mpiexec prefix of a run, and
// a checkpoint directory's safetensors files compared byte for byte.
#pragma once

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

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

}  // namespace minidl::testing
