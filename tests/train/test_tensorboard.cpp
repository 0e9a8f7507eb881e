// train/tensorboard.h's formats against hand-derived bytes: CRC-32C's check value, TFRecord's mask, and one scalar
// Event field by field. (That TensorBoard itself reads the files: TrainGpt.TensorBoardReadsTheEventFiles.)
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "train/tensorboard.h"

using namespace minidl;

TEST(TensorBoard, Crc32cCheckValueAndMask) {
  EXPECT_EQ(train::crc32c("123456789", 9), 0xE3069283u);  // the Castagnoli polynomial's published check value
  EXPECT_EQ(train::crc32c("", 0), 0u);
  // ((c >> 15) | (c << 17)) + 0xa282ead8 for c = 0xE3069283, worked by hand.
  EXPECT_EQ(train::masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

TEST(TensorBoard, ScalarEventBytes) {
  const std::string e = train::scalar_event("loss", 1.5f, 3, 0.0);
  const std::vector<uint8_t> want = {
      0x09, 0,    0,    0,    0,    0,   0, 0, 0,  // wall_time (1, fixed64) = 0.0
      0x10, 0x03,                                  // step (2, varint) = 3
      0x2A, 0x0D,                                  // summary (5, length 13)
      0x0A, 0x0B,                                  //   value (1, length 11)
      0x0A, 0x04, 'l',  'o',  's',  's',           //     tag (1) = "loss"
      0x15, 0x00, 0x00, 0xC0, 0x3F,                //     simple_value (2, fixed32) = 1.5f
  };
  ASSERT_EQ(e.size(), want.size());
  EXPECT_EQ(std::memcmp(e.data(), want.data(), want.size()), 0);
}

TEST(TensorBoard, RecordFraming) {
  const std::string data = "123456789";
  const std::string r = train::tf_record(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  uint64_t length = 0;
  uint32_t length_crc = 0, data_crc = 0;
  std::memcpy(&length, r.data(), 8);
  std::memcpy(&length_crc, r.data() + 8, 4);
  std::memcpy(&data_crc, r.data() + 12 + data.size(), 4);
  EXPECT_EQ(length, data.size());
  EXPECT_EQ(length_crc, train::masked_crc32c(r.data(), 8));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(data_crc, 0xC78AB0E5u);
}
