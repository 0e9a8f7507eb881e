#include "nn/atomic_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace minidl::nn {

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  file_ = std::fopen(tmp_path_.c_str(), "wb");
  MINIDL_CHECK(file_ != nullptr, "cannot open '", tmp_path_, "' for writing: ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_ == nullptr) return;  // committed
  std::fclose(file_);
  std::remove(tmp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t bytes) {
  MINIDL_ASSERT(file_ != nullptr, "AtomicFile::write after commit");
  if (bytes == 0) return;
  MINIDL_CHECK(std::fwrite(data, 1, bytes, file_) == bytes, "writing '", tmp_path_, "' failed: ", std::strerror(errno));
}

void AtomicFile::commit() {
  MINIDL_ASSERT(file_ != nullptr, "AtomicFile::commit called twice");
  // fsync before the rename: otherwise a crash can leave the new name pointing at data never written to disk.
  int err = 0;
  if (std::fflush(file_) != 0 || ::fsync(fileno(file_)) != 0) err = errno;
  if (std::fclose(file_) != 0 && err == 0) err = errno;
  file_ = nullptr;
  std::error_code ec;
  if (err == 0) std::filesystem::rename(tmp_path_, path_, ec);
  if (err != 0 || ec) std::remove(tmp_path_.c_str());
  MINIDL_CHECK(err == 0, "writing '", tmp_path_, "' failed: ", std::strerror(err));
  MINIDL_CHECK(!ec, "renaming '", tmp_path_, "' to '", path_, "' failed: ", ec.message());
}

void write_text_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFile f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

}  // namespace minidl::nn
