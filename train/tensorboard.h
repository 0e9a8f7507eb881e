// TensorBoard event files written by minidl itself: no protobuf and no TensorFlow, only the two formats TensorBoard
// reads.
//
//   train::EventWriter tb("runs/baby");                 // runs/baby/events.out.tfevents.<time>.<host>.<pid>.minidl
//   tb.scalar("train/loss", 3.14, /*step=*/10);
//   tb.flush();                                          // also done every 10 scalars and by the destructor
//
// The record framing (TensorFlow's TFRecord): uint64 length, uint32 masked CRC-32C of those 8 bytes, the data,
// uint32 masked CRC-32C of the data, all little-endian; mask(c) = ((c >> 15) | (c << 17)) + 0xa282ead8.
// The data is a serialized tensorflow.Event message: wall_time (field 1, double), step (2, int64) and either
// file_version (3, string: "brain.Event:2", the first record) or summary (5: a Summary holding one Value with tag
// (1, string) and simple_value (2, float)). Verified by the real reader: tests load the files with TensorBoard's
// EventAccumulator.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace minidl::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes: 0xE3069283 for "123456789".
uint32_t crc32c(const void* data, size_t size);
// TFRecord's masked CRC.
uint32_t masked_crc32c(const void* data, size_t size);
// One TFRecord: the framing above around `data`.
std::string tf_record(const std::string& data);
// A serialized Event holding one scalar.
std::string scalar_event(const std::string& tag, float value, int64_t step, double wall_time);

class EventWriter {
 public:
  // Creates `dir` (and its parents) and a new event file in it, starting with the file_version record. Throws
  // naming the file when it cannot be written.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  void scalar(const std::string& tag, double value, int64_t step);
  void flush();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  int unflushed_ = 0;
};

}  // namespace minidl::train
