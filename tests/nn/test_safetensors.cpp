// safetensors writer and reader: bitwise round trips, the reference's golden bytes, a hand-built file, and the
// errors a damaged file must produce.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "core/rng.h"
#include "nn/safetensors.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;
using minidl::testing::read_bytes;
using minidl::testing::TempDir;
using minidl::testing::write_bytes;

namespace {

// A tensor whose bytes are random (every bit pattern, NaN payloads included, must survive).
Tensor random_bits(const Shape& shape, DType dt, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dt);
  auto* p = static_cast<uint8_t*>(t.raw_data());
  Philox rng(seed);
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(rng.draw(i).x);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int b = 0; b < 8; ++b) s[b] = char(uint8_t(n >> (8 * b)));
  return s;
}

// A file made of an 8-byte length, `header` and `data`.
std::string file_bytes(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

}  // namespace

TEST(Safetensors, RoundTripIsBitwiseForEveryDtype) {
  TempDir dir;
  NamedTensors tensors = {
      {"f32", random_bits({3, 5}, DType::f32, 1)},
      {"f64", random_bits({4}, DType::f64, 2)},
      {"f16", random_bits({2, 3, 3}, DType::f16, 3)},
      {"bf16", random_bits({7}, DType::bf16, 4)},
      {"i32", random_bits({2, 2}, DType::i32, 5)},
      {"i64", random_bits({3}, DType::i64, 6)},
      {"u8", random_bits({5}, DType::u8, 7)},
      {"scalar", Tensor::scalar(3.25)},
      {"empty", Tensor::zeros({0, 4})},
  };
  Metadata meta = {{"format", "pt"}, {"note", "{\"nested\": \"json as a string\"}"}};
  std::string path = dir.file("all.safetensors");
  save_safetensors(path, tensors, meta);

  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata, meta);
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(same_bytes(f.tensors.at(name), t)) << name;
  EXPECT_EQ(f.tensors.at("scalar").dim(), 0);
  EXPECT_EQ(f.tensors.at("scalar").item(), 3.25);
}

TEST(Safetensors, NonContiguousTensorsAreSavedInLogicalOrder) {
  TempDir dir;
  Tensor x = Tensor::arange(6).reshape({2, 3});
  save_safetensors(dir.file("t.safetensors"), {{"xt", x.transpose(0, 1)}});
  Tensor back = load_safetensors(dir.file("t.safetensors")).tensors.at("xt");
  EXPECT_EQ(back.shape(), (Shape{3, 2}));
  EXPECT_EQ(back.to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Safetensors, HeaderAndTensorsAreAligned) {
  TempDir dir;
  std::string path = dir.file("a.safetensors");
  save_safetensors(path,
                   {{"a", random_bits({3}, DType::u8, 1)},
                    {"b", random_bits({3}, DType::f64, 2)},
                    {"c", random_bits({1}, DType::f16, 3)},
                    {"d", random_bits({3}, DType::f32, 4)}},
                   {{"k", "v"}});
  std::string bytes = read_bytes(path);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(uint8_t(bytes[b])) << (8 * b);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.data_start, 8 + n);
  for (const auto& [name, e] : h.entries) EXPECT_EQ(e.begin % dtype_size(e.dtype), 0u) << name;
  EXPECT_EQ(h.entries.at("b").begin, 0u);  // largest element size first
}

// The reference implementation's own test vector (bindings/python/tests/test_pt_comparison.py).
TEST(Safetensors, MatchesTheReferenceWriterByteForByte) {
  TempDir dir;
  std::string path = dir.file("golden.safetensors");
  Tensor t = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4}, {2, 2});
  save_safetensors(path, {{"test", t}});
  std::string header = "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}    ";
  std::string expected = std::string("@\0\0\0\0\0\0\0", 8) + header + std::string(static_cast<char*>(t.raw_data()), 16);
  EXPECT_EQ(read_bytes(path), expected);
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  TempDir dir;
  std::string path = dir.file("hand.safetensors");
  // Keys in any order, metadata in the middle, spaces in the JSON, no padding: all allowed by the format.
  std::string header =
      "{ \"w\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [8, 16]},"
      "  \"__metadata__\": {\"format\": \"pt\"},"
      "  \"v\": {\"shape\": [2], \"dtype\": \"F32\", \"data_offsets\": [0, 8]} }";
  float v[2] = {1.5f, -2.0f};
  std::string data(reinterpret_cast<const char*>(v), 8);
  data += std::string("\x10@\x80?\x80?\x80?", 8);  // bf16 [[2.25, 1], [1, 1]] (the reference's example)
  write_bytes(path, file_bytes(header, data));

  SafetensorsFile f = load_safetensors(path);
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.tensors.at("v").to_vector(), (std::vector<double>{1.5, -2.0}));
  EXPECT_EQ(f.tensors.at("w").dtype(), DType::bf16);
  EXPECT_EQ(f.tensors.at("w").shape(), (Shape{2, 2}));
  EXPECT_EQ(f.tensors.at("w").to_vector(), (std::vector<double>{2.25, 1, 1, 1}));
}

TEST(Safetensors, CorruptFilesAreRejectedWithTheProblemNamed) {
  TempDir dir;
  std::string path = dir.file("bad.safetensors");
  auto expect_bad = [&](const std::string& bytes, std::initializer_list<std::string> parts) {
    write_bytes(path, bytes);
    expect_error([&] { load_safetensors(path); }, parts);
  };
  const std::string ok_entry = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const std::string eight(8, '\0');

  expect_bad("abc", {path, "too short", "3 bytes"});
  expect_bad(le64(1000) + "{}", {path, "header length 1000", "runs past the end"});
  expect_bad(file_bytes(ok_entry, eight).substr(0, 40), {path, "runs past the end"});  // truncated in the header
  expect_bad(file_bytes(ok_entry, eight.substr(0, 5)), {path, "lie outside the data buffer"});  // truncated data
  expect_bad(file_bytes("{\"a\": [1, 2", ""), {path, "not valid JSON"});
  expect_bad(file_bytes("[1, 2]", ""), {path, "must be a JSON object"});
  expect_bad(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", eight),
             {path, "'a'", "[8, 16]", "outside the data buffer (8 bytes)"});
  expect_bad(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                        std::string(12, '\0')),
             {path, "'b'", "overlap", "'a'"});
  expect_bad(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", eight),
             {path, "'a'", "span 8 bytes", "need 12"});
  expect_bad(file_bytes("{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}", eight),
             {path, "unknown dtype \"Q4\""});
  expect_bad(file_bytes("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", std::string(12, '\0')),
             {path, "hole", "[0, 4)"});
  expect_bad(file_bytes(ok_entry, std::string(12, '\0')), {path, "holds 12 bytes", "cover 8"});
  expect_bad(file_bytes("{\"__metadata__\":{\"step\":5}}", ""), {path, "__metadata__['step'] must be a string"});
  expect_error([&] { load_safetensors(dir.file("missing.safetensors")); }, {"missing.safetensors", "cannot read"});
}

TEST(Safetensors, WriterLeavesNoTempFileAndNeverClobbersOnFailure) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"a", Tensor::ones({2})}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  const std::string before = read_bytes(path);

  expect_error(
      [&] {
        save_safetensors(path, {{"a", Tensor::zeros({3})}, {"b", Tensor()}});
      },
      {path, "'b'", "undefined"});
  expect_error(
      [&] {
        save_safetensors(path, {{"a", Tensor::zeros({3})}, {"a", Tensor::zeros({1})}});
      },
      {"duplicate tensor name 'a'"});
  expect_error([&] { save_safetensors(path, {{"__metadata__", Tensor::zeros({1})}}); }, {"invalid tensor name"});
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  std::string nowhere = dir.file("no/such/dir/m.safetensors");
  expect_error([&] { save_safetensors(nowhere, {{"a", Tensor::ones({2})}}); }, {nowhere + ".tmp", "cannot open"});
}
