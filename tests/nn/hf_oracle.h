// What the transformers oracles (test_llama_hf.cpp, test_moe_hf.cpp) share: the oracles' interpreter, a batch as
// JSON rows, minidl's greedy tokens with the KV cache (each checked against the uncached argmax), and running an
// oracle script over case folders, one JSON object per case.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "autograd/node.h"
#include "nn/gpt.h"
#include "support/run_program.h"

namespace minidl::testing {

// The oracles' python (MINIDL_ORACLES_VENV, default /opt/minidl-oracles), or "" when it has no transformers.
inline std::string oracle_python() {
  const char* venv = std::getenv("MINIDL_ORACLES_VENV");
  const std::string python = std::string(venv ? venv : "/opt/minidl-oracles") + "/bin/python";
  return run_program(python + " -c 'import transformers'").code == 0 ? python : "";
}

// (B, T) integers as B lists of T.
inline nlohmann::json batch_rows(const Tensor& t) {
  nlohmann::json j = nlohmann::json::array();
  const auto v = t.to_vector();
  for (int64_t b = 0; b < t.size(0); ++b)
    j.push_back(std::vector<int64_t>(v.begin() + b * t.size(1), v.begin() + (b + 1) * t.size(1)));
  return j;
}

inline int32_t argmax_last(const Tensor& logits) {
  const auto v = logits.to_vector();
  const int64_t V = logits.size(2);
  const auto first = v.end() - V;
  return int32_t(std::max_element(first, v.end()) - first);
}

// n greedy tokens after `prompt` with the KV cache (the model switched to eval), each expected to equal the
// uncached forward's argmax.
inline std::vector<int32_t> greedy_tokens(nn::GPT& m, const std::vector<int32_t>& prompt, int n,
                                          const std::string& what) {
  m.eval();
  autograd::NoGradGuard no_grad;
  std::vector<int32_t> seq = prompt, greedy;
  nn::KVCache cache;
  Tensor l = m.forward_cached(Tensor::from_vector(prompt, {1, int64_t(prompt.size())}), cache);
  for (int i = 0; i < n; ++i) {
    const int32_t next = argmax_last(l);
    EXPECT_EQ(next, argmax_last(m.forward(Tensor::from_vector(seq, {1, int64_t(seq.size())}))))
        << what << ": cached and uncached greedy tokens differ at " << i;
    greedy.push_back(next);
    seq.push_back(next);
    l = m.forward_cached(Tensor::from_vector(std::vector<int32_t>{next}, {1, 1}), cache);
  }
  return greedy;
}

// ids.json of a case folder: the batch, the greedy prompt and minidl's greedy tokens.
inline void write_ids(const std::string& dir, const Tensor& ids, const Tensor& targets,
                      const std::vector<int32_t>& prompt, const std::vector<int32_t>& greedy) {
  std::ofstream(dir + "/ids.json") << nlohmann::json{
      {"ids", batch_rows(ids)},
      {"targets", batch_rows(targets)},
      {"prompt", prompt},
      {"greedy", greedy}}.dump();
}

// `script` (under tests/nn) over the case folders: its JSON lines, parsed; the script's failure is a test failure.
inline std::vector<nlohmann::json> run_oracle(const std::string& python, const std::string& script,
                                              const std::vector<std::string>& dirs) {
  std::string args;
  for (const std::string& d : dirs) args += " " + d;
  const auto r = run_program(python + " " + SOURCE_DIR + "/tests/nn/" + script + args);
  EXPECT_EQ(r.code, 0) << r.out;
  std::vector<nlohmann::json> out;
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace minidl::testing
