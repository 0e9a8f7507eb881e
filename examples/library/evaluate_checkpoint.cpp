// Loads a model train_gpt saved (--save FILE), evaluates it on the validation split of a corpus, and samples from
// it: what a program of one's own does with a checkpoint (docs/library.md).
//
//   build/bin/example_evaluate_checkpoint out/model.safetensors data/tinyshakespeare.txt 256 12
//   # "val_loss X" (train_gpt's val_loss for the same --eval-windows and --batch), then 200 sampled characters
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "data/sampler.h"
#include "data/text_dataset.h"
#include "nn/checkpoint.h"
#include "train/evaluate.h"

using namespace minidl;

// argv[i] as a positive count, or a message naming the argument.
static int64_t positive(const char* what, const char* text) {
  char* end = nullptr;
  const long long n = std::strtoll(text, &end, 10);
  MINIDL_CHECK(*text != '\0' && *end == '\0' && n > 0, what, ": expected a positive integer, got '", text, "'");
  return n;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT.safetensors CORPUS.txt [WINDOWS] [BATCH] [GPT2_ENCODING]\n", argv[0]);
    return 2;
  }
  try {
    const std::string path = argv[1], corpus = argv[2];
    const int64_t windows = argc > 3 ? positive("WINDOWS", argv[3]) : 256;   // train_gpt's --eval-windows
    const int64_t batch = argc > 4 ? positive("BATCH", argv[4]) : 12;        // and --batch: the windows at a time
    const std::string encoding = argc > 5 ? argv[5] : "data/gpt2.tiktoken";  // only for a gpt2 checkpoint

    nn::GPTCheckpoint ck = nn::load_gpt(path);  // the config and the tokenizer, from the file's header
    nn::GPT model(ck.config);
    nn::load_into(model, path);
    const auto vocab = ck.metadata.find("vocab");
    MINIDL_CHECK(vocab != ck.metadata.end(), path,
                 ": expected the tokenizer in the metadata's \"vocab\" (as "
                 "train_gpt --save writes it), found none");
    const data::Tokenizer tokenizer = data::Tokenizer::from_json(nlohmann::json::parse(vocab->second), encoding);

    // The validation split as train_gpt cuts it (the last 10%), in windows of block_size + 1 tokens.
    const data::TextDataset ds(corpus, tokenizer);
    const int64_t seq = ck.config.block_size;
    const data::Batch val =
        data::eval_windows(ds.val(), seq, std::min<int64_t>(windows, int64_t(ds.val().size()) / (seq + 1)));
    train::Stage stage = train::Stage::of(model);
    std::printf("val_loss %.9g\n", train::evaluate(stage, val, batch));

    // 200 tokens after the validation split's first (generate returns the prompt, then the new tokens).
    const std::vector<int32_t> text = train::generate(model, {ds.val().front()}, {.max_new_tokens = 200, .seed = 1});
    std::printf("%s\n", tokenizer.decode(text).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_evaluate_checkpoint: error: %s\n", e.what());
    return 2;
  }
}
