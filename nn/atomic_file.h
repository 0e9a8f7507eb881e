// AtomicFile: writes a file so that readers only ever see the old file or the complete new one.
//
//   AtomicFile f("ckpt/model.safetensors");   // opens "ckpt/model.safetensors.tmp"
//   f.write(header.data(), header.size());
//   f.commit();                                // flush, fsync, rename over the target
//
// If commit() is never reached (an exception, a full disk), the destructor deletes the .tmp file and the target
// is left untouched. Errors name the path and the system's reason.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace minidl::nn {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void commit();

  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
};

// Writes `contents` to `path` through an AtomicFile.
void write_text_file_atomically(const std::string& path, const std::string& contents);

}  // namespace minidl::nn
