// The data tests' corpus folder and a file's bytes.
#pragma once

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace minidl::testing {

// The corpus folder: MINIDL_DATA_DIR (CTest sets it), else the one the build was configured with.
inline std::string data_dir() {
  const char* dir = std::getenv("MINIDL_DATA_DIR");
  return dir ? dir : MINIDL_TEST_DATA_DIR;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace minidl::testing
