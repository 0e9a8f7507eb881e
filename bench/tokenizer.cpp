// bench_tokenizer — GPT-2 encoding speed (data/bpe_tokenizer.h) on one thread: the text file is encoded --reps
// times and the median is printed as MB/s of UTF-8 input, beside the CPU's name. With --tiktoken PYTHON, tiktoken
// (the real client, in that interpreter) encodes the same file in turns with minidl, round by round, and the line
// gives both medians and their ratio: tiktoken's Rust core is the speed to meet.
//
//   build/bin/bench_tokenizer --text data/tinyshakespeare.txt
//   build/bin/bench_tokenizer --tiktoken /opt/minidl-oracles/bin/python --rounds 5
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench/cli.h"
#include "bench/provenance.h"
#include "bench/timing.h"
#include "core/error.h"
#include "data/bpe_tokenizer.h"
#include "ops/cpu/simd/isa.h"

using namespace minidl;

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MINIDL_CHECK(in.good(), "--text ", path, ": cannot open the file");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// tiktoken's seconds per encode of `text_path`: the median of `reps` in one Python process.
double tiktoken_seconds(const std::string& python, const std::string& encoding, const std::string& text_path,
                        int reps) {
  const std::string script = std::string(MINIDL_SOURCE_DIR) + "/tests/data/tiktoken_ids.py";
  const std::string command =
      python + " -c \"import runpy, statistics, sys, time; m = runpy.run_path('" + script +
      "'); enc = m['encoding']('" + encoding + "'); text = open('" + text_path +
      "', encoding='utf-8', newline='').read(); t = []\n"
      "for _ in range(" +
      std::to_string(reps) +
      "):\n"
      "    s = time.perf_counter(); enc.encode_ordinary(text); t.append(time.perf_counter() - s)\n"
      "print(statistics.median(t))\"";
  FILE* p = popen(command.c_str(), "r");
  MINIDL_CHECK(p != nullptr, "--tiktoken: cannot run ", python);
  double seconds = -1;
  const int read = std::fscanf(p, "%lf", &seconds);
  const int status = pclose(p);
  MINIDL_CHECK(read == 1 && status == 0 && seconds > 0, "--tiktoken: ", python,
               " did not time tiktoken (is tiktoken installed there? scripts/install-deps.sh --with-oracles)");
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::string text_path = std::string(MINIDL_SOURCE_DIR) + "/data/tinyshakespeare.txt";
  std::string encoding = std::string(MINIDL_SOURCE_DIR) + "/data/gpt2.tiktoken";
  std::string python;
  int reps = 5, rounds = 3;
  CLI::App app{"GPT-2 BPE encoding speed on one thread, optionally in turns with tiktoken"};
  app.add_option("--text", text_path, "UTF-8 text file to encode")->capture_default_str();
  app.add_option("--encoding", encoding, "GPT-2's encoding file")->capture_default_str();
  app.add_option("--reps", reps, "Encodes per round (the median counts)")
      ->check(bench::kPositiveCount)
      ->capture_default_str();
  app.add_option("--rounds", rounds, "With --tiktoken: rounds of minidl then tiktoken")
      ->check(bench::kPositiveCount)
      ->capture_default_str();
  app.add_option("--tiktoken", python, "A Python interpreter that has tiktoken: time it in turns with minidl");
  if (std::optional<int> code = bench::parse_flags(app, argc, argv, "bench_tokenizer")) return *code;
  try {
    const data::BpeTokenizer tok = data::BpeTokenizer::gpt2(encoding);
    const std::string text = read(text_path);
    const double mb = double(text.size()) / 1e6;
    std::fputs(bench::provenance_header(bench::provenance(argc, argv)).c_str(), stdout);
    std::printf("# cpu: %s; one thread; %s (%.2f MB)\n", ops::simd::host_cpu_name().c_str(), text_path.c_str(), mb);
    std::vector<double> ours_rounds, theirs_rounds;
    size_t tokens = 0;
    for (int r = 0; r < (python.empty() ? 1 : rounds); ++r) {
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        tokens = tok.encode(text).size();
        t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      ours_rounds.push_back(mb / bench::median(t));
      if (!python.empty()) theirs_rounds.push_back(mb / tiktoken_seconds(python, encoding, text_path, reps));
    }
    std::printf("minidl   %8.2f MB/s  (%zu tokens)\n", bench::median(ours_rounds), tokens);
    if (!python.empty())
      std::printf("tiktoken %8.2f MB/s  minidl/tiktoken %.2f (medians of %d rounds in turns)\n",
                  bench::median(theirs_rounds), bench::median(ours_rounds) / bench::median(theirs_rounds), rounds);
  } catch (const Error& e) {
    std::fprintf(stderr, "bench_tokenizer: error: %s\n", e.what());
    return 2;
  }
  return 0;
}
