#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace minidl::train {

namespace {

std::array<uint32_t, 256> crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// Protocol buffers' wire format, the three pieces an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += char(uint8_t(v) | 0x80);
    v >>= 7;
  }
  out += char(uint8_t(v));
}

void key(std::string& out, int field, int wire_type) { varint(out, uint64_t(field) << 3 | uint64_t(wire_type)); }

template <class T>
void little_endian(std::string& out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86 and ARM are little-endian, as the format
  out.append(bytes, sizeof(T));
}

void length_delimited(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

std::string event_header(int64_t step, double wall_time) {
  std::string e;
  key(e, 1, 1);  // wall_time: double, 64-bit
  little_endian(e, wall_time);
  key(e, 2, 0);  // step: int64, varint
  varint(e, uint64_t(step));
  return e;
}

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc_table();
  uint32_t c = 0xFFFFFFFFu;
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tf_record(const std::string& data) {
  std::string r;
  little_endian(r, uint64_t(data.size()));
  little_endian(r, masked_crc32c(r.data(), 8));
  r += data;
  little_endian(r, masked_crc32c(data.data(), data.size()));
  return r;
}

std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time) {
  std::string v;
  length_delimited(v, 1, tag);  // Value.tag
  key(v, 2, 5);                 // Value.simple_value: float, 32-bit
  little_endian(v, value);
  std::string summary;
  length_delimited(summary, 1, v);  // Summary.value
  std::string e = event_header(step, wall_time);
  length_delimited(e, 5, summary);  // Event.summary
  return e;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double t = now_s();
  path_ = (std::filesystem::path(dir) / ("events.out.tfevents." + std::to_string(int64_t(t)) + "." + host + "." +
                                         std::to_string(::getpid()) + ".minidl"))
              .string();
  file_ = std::fopen(path_.c_str(), "wb");
  MINIDL_CHECK(file_ != nullptr, "--tensorboard: cannot write ", path_, ": ", std::strerror(errno));
  std::string version = event_header(0, t);
  length_delimited(version, 3, "brain.Event:2");  // Event.file_version
  const std::string record = tf_record(version);
  std::fwrite(record.data(), 1, record.size(), file_);
  flush();
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::scalar(const std::string& tag, double value, int64_t step) {
  const std::string record = tf_record(scalar_event(tag, float(value), step, now_s()));
  MINIDL_CHECK(std::fwrite(record.data(), 1, record.size(), file_) == record.size(), "--tensorboard: writing ", path_,
               " failed: ", std::strerror(errno));
  if (++unflushed_ >= 10) flush();
}

void EventWriter::flush() {
  std::fflush(file_);
  unflushed_ = 0;
}

}  // namespace minidl::train
