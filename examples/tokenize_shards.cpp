// tokenize_shards — text files to GPT-2 token shards in llm.c's format (data/token_shards.h), which train_gpt reads
// with --data 'DIR/NAME_*.bin' (and llm.c trains on as they are).
//
//   build/bin/tokenize_shards --out out data/tinyshakespeare.txt
//   -> out/shakespeare_val_000000.bin, out/shakespeare_train_000001.bin, ...
//   build/bin/train_gpt --data 'out/shakespeare_*.bin' --layers 6 --heads 6 --embd 384 --seq 256
//
// Every input file is one document, led by <|endoftext|> as llm.c's scripts lead theirs. The first --val-fraction
// of all tokens (in file order) are written as validation shards ("val" in their names: llm.c's convention), the
// rest as training shards, each of at most --shard-tokens tokens. Encoding runs on --threads threads
// (BpeTokenizer::encode_parallel: the same ids as one thread). Shards are written atomically; a bad input prints
// "tokenize_shards: error: ..." and exits 2 having written nothing.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "data/text_dataset.h"
#include "data/token_shards.h"

using namespace minidl;

int main(int argc, char** argv) {
  std::vector<std::string> inputs;
  std::string out_dir, name = "shakespeare", encoding = MINIDL_DEFAULT_GPT2_ENCODING;
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.1;
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  CLI::App app{"Tokenize text files with GPT-2's BPE into token shards in llm.c's format"};
  app.add_option("files", inputs, "Text files, one document each")->required();
  app.add_option("--out", out_dir, "Folder for the shards (created if missing)")->required();
  app.add_option("--name", name, "Shard names: NAME_val_000000.bin, NAME_train_000001.bin, ...")->capture_default_str();
  app.add_option("--shard-tokens", shard_tokens, "Tokens per shard at most")
      ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)))
      ->capture_default_str();
  app.add_option("--val-fraction", val_fraction, "Fraction of the tokens (the first ones) for validation")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--threads", threads, "Encoding threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--gpt2-encoding", encoding, "GPT-2's encoding file")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::fprintf(stderr, "tokenize_shards: error: %s (see --help)\n", e.what());
    return 2;
  }
  try {
    MINIDL_CHECK(!name.empty() && name.find('/') == std::string::npos, "--name: expected a file-name prefix, got '",
                 name, "'");
    const data::BpeTokenizer tok = data::BpeTokenizer::gpt2(encoding);
    std::vector<int32_t> tokens;
    for (const std::string& file : inputs) {
      const std::string text = data::read_text_file(file);
      tokens.push_back(data::BpeTokenizer::kGpt2EndOfText);
      const std::vector<int32_t> ids = tok.encode_parallel(text, threads);
      tokens.insert(tokens.end(), ids.begin(), ids.end());
      std::printf("%s: %zu bytes, %zu tokens\n", file.c_str(), text.size(), ids.size());
    }
    const int64_t total = int64_t(tokens.size());
    const int64_t val = std::min<int64_t>(total - 1, std::max<int64_t>(1, int64_t(double(total) * val_fraction)));
    MINIDL_CHECK(total >= 2, "the input holds ", total, " token(s): expected at least one for each split");
    std::filesystem::create_directories(out_dir);
    int index = 0;
    auto write = [&](const char* split, int64_t begin, int64_t end) {
      for (int64_t at = begin; at < end; at += shard_tokens, ++index) {
        char file[64];
        std::snprintf(file, sizeof file, "_%s_%06d.bin", split, index);
        const std::string path = (std::filesystem::path(out_dir) / (name + file)).string();
        const int64_t n = std::min(shard_tokens, end - at);
        data::write_token_shard(path, std::span<const int32_t>(tokens.data() + at, size_t(n)));
        std::printf("wrote %s: %lld tokens\n", path.c_str(), (long long)n);
      }
    };
    write("val", 0, val);
    write("train", val, total);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_shards: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
