// GPT checkpoints: save -> load into a fresh model is bitwise; metadata and config.json say what they should;
// a model of another shape is refused with the tensor and both shapes named.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "nn/checkpoint.h"
#include "test_util.h"

using namespace minidl;
using namespace minidl::nn;
using minidl::testing::expect_error;
using minidl::testing::read_bytes;
using minidl::testing::TempDir;

namespace {

const GPTConfig kCfg{.vocab_size = 11, .block_size = 8, .n_layer = 2, .n_head = 3, .n_embd = 12, .dropout = 0.1};
const std::string kVocab = R"(["\n", " ", "a", "b", "c", "d", "e", "f", "g", "h", "i"])";

}  // namespace

TEST(Checkpoint, SaveThenLoadIsBitwise) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  GPT trained(kCfg, 1);
  save_gpt(path, trained, kVocab, {{"step", "250"}});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("config.json.tmp")));

  GPTCheckpoint ck = load_gpt(path);
  EXPECT_EQ(ck.config, kCfg);
  GPT fresh(ck.config, 2);
  load_into(fresh, path);
  auto a = trained.named_parameters(), b = fresh.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].second.shape(), b[i].second.shape()) << a[i].first;
    EXPECT_EQ(std::memcmp(a[i].second.raw_data(), b[i].second.raw_data(), a[i].second.nbytes()), 0) << a[i].first;
  }
}

TEST(Checkpoint, MetadataAndTensorNames) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  GPT model(kCfg, 1);
  save_gpt(path, model, kVocab, {{"step", "250"}, {"val_loss", "1.5"}});

  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.metadata.at("vocab"), kVocab);
  EXPECT_EQ(h.metadata.at("step"), "250");
  EXPECT_EQ(h.metadata.at("val_loss"), "1.5");
  EXPECT_EQ(gpt_config_from_json(h.metadata.at("config")), kCfg);
  EXPECT_EQ(nlohmann::json::parse(h.metadata.at("config")).at("n_embd"), 12);

  // Every parameter under its HF name, f32, and no separate head (it is tied to wte).
  EXPECT_EQ(h.entries.size(), model.named_parameters().size());
  for (const auto& [name, p] : model.named_parameters()) {
    ASSERT_TRUE(h.entries.count(name)) << name;
    EXPECT_EQ(h.entries.at(name).shape, p.shape()) << name;
    EXPECT_EQ(h.entries.at(name).dtype, DType::f32) << name;
  }
  EXPECT_FALSE(h.entries.count("lm_head.weight"));
  EXPECT_EQ(h.entries.at("transformer.h.1.mlp.c_fc.weight").shape, (Shape{12, 48}));
}

TEST(Checkpoint, WritesAHuggingFaceConfigBesideTheFile) {
  TempDir dir;
  GPT model(kCfg, 1);
  save_gpt(dir.file("model.safetensors"), model, kVocab);
  nlohmann::json c = nlohmann::json::parse(read_bytes(dir.file("config.json")));
  EXPECT_EQ(c.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(c.at("model_type"), "gpt2");
  EXPECT_EQ(c.at("vocab_size"), 11);
  EXPECT_EQ(c.at("n_positions"), 8);
  EXPECT_EQ(c.at("n_embd"), 12);
  EXPECT_EQ(c.at("n_layer"), 2);
  EXPECT_EQ(c.at("n_head"), 3);
  EXPECT_TRUE(c.at("n_inner").is_null());
  EXPECT_EQ(c.at("activation_function"), "gelu_new");
  EXPECT_DOUBLE_EQ(c.at("resid_pdrop").get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(c.at("embd_pdrop").get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(c.at("attn_pdrop").get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(c.at("layer_norm_epsilon").get<double>(), 1e-5);
  EXPECT_EQ(c.at("tie_word_embeddings"), true);
  EXPECT_TRUE(c.contains("bos_token_id"));
  EXPECT_TRUE(c.contains("eos_token_id"));
}

TEST(Checkpoint, LoadingIntoAnotherShapeNamesTheTensorAndShapes) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  save_gpt(path, GPT(kCfg, 1), kVocab);

  GPTConfig wider = kCfg;
  wider.vocab_size = 13;
  GPT other(wider);
  expect_error([&] { load_into(other, path); },
               {path, "transformer.wte.weight: expected shape (13, 12), found (11, 12)"});

  GPTConfig deeper = kCfg;
  deeper.n_layer = 3;
  GPT three(deeper);
  expect_error([&] { load_into(three, path); }, {path, "missing", "transformer.h.2.attn.c_attn.weight"});
}

TEST(Checkpoint, RejectsReservedKeysBadVocabAndForeignFiles) {
  TempDir dir;
  std::string path = dir.file("model.safetensors");
  GPT model(kCfg, 1);
  expect_error([&] { save_gpt(path, model, kVocab, {{"config", "x"}}); }, {"'config'", "reserved"});
  expect_error([&] { save_gpt(path, model, "[\"a\", "); }, {"vocabulary must be a JSON document"});
  EXPECT_FALSE(std::filesystem::exists(path));

  save_safetensors(path, {{"x", Tensor::ones({2})}});
  expect_error([&] { load_gpt(path); }, {path, "no \"config\""});
}
