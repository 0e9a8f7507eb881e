// GPT checkpoints: a safetensors file with Hugging Face tensor names, plus a Hugging Face `config.json` in the same
// directory, so `GPT2LMHeadModel.from_pretrained(dir)` / `LlamaForCausalLM.from_pretrained(dir)` (or
// scripts/load_in_pytorch.py) loads what minidl trained; and the other way, a folder that save_pretrained wrote.
//
//   save_gpt("out/model.safetensors", model, tokenizer_vocab_json, {{"step", "5000"}});
//   GPTCheckpoint ck = load_gpt("out/model.safetensors");     // config + metadata, header only
//   GPT fresh(ck.config);
//   load_into(fresh, "out/model.safetensors");                // every parameter, with shape checks
//   GPTCheckpoint hf = load_gpt("smollm-dir");                // a folder: config.json (model_type gpt2 | llama)
//
// File contents:
// - tensors: every parameter by its HF name and in HF's layout (nn/hf_format.h): GPT-2's are minidl's own
//   (transformer.h.0.attn.c_attn.weight, weights (in, out) as HF's Conv1D; the head tied to transformer.wte.weight
//   and not stored); a Llama's are LlamaForCausalLM's (model.layers.0.self_attn.q_proj.weight, (out, in)). f32.
// - __metadata__: {"format": "pt", "config": <GPTConfig as JSON>, "vocab": <the caller's vocabulary JSON>,
//   + the caller's extras}. "format": "pt" is what Hugging Face transformers requires to accept the file.
// - config.json (written beside it, replacing any config.json there): the HF configuration (nn::hf_config_json),
//   for GPT-2 with resid_pdrop = embd_pdrop = dropout and attn_pdrop = 0 (minidl's fused attention has no
//   probability dropout), and null bos/eos token ids (a byte/char vocabulary has neither).
// Both files are written via a temporary and a rename: a crash never leaves a half-written checkpoint.
// A folder without minidl's metadata (transformers' save_pretrained) is read through its config.json, its tensors
// from model.safetensors or a sharded index, f16/bf16 widened to f32; its tokenizer is the folder's tokenizer.json
// ("vocab": {"type": "hf", "file": ...}), or GPT-2's where it ships none.
#pragma once

#include <string>

#include "nn/gpt.h"
#include "nn/safetensors.h"

namespace minidl::nn {

struct GPTCheckpoint {
  GPTConfig config;
  Metadata metadata;  // everything in __metadata__, including "config" and "vocab"
};

// vocab_json: the tokenizer vocabulary as a JSON document (checked to parse). extras must not use the keys
// "format", "config" or "vocab".
void save_gpt(const std::string& path, const GPT& model, const std::string& vocab_json, const Metadata& extras = {});

// Reads the config and metadata of a checkpoint (header only): a file, or a folder (minidl's --save, or one that
// transformers' save_pretrained wrote).
GPTCheckpoint load_gpt(const std::string& path);

// Copies every tensor of the checkpoint (a file or a folder, nn::read_model_tensors) into the model's parameters.
// Missing or unexpected names and shape mismatches (a model built with another config) are errors naming the tensors
// and the expected and found shapes.
void load_into(GPT& model, const std::string& path);

// GPTConfig <-> the JSON string stored in the metadata: {"vocab_size": 65, "block_size": 256, ...}.
std::string gpt_config_to_json(const GPTConfig& cfg);
GPTConfig gpt_config_from_json(const std::string& json);

}  // namespace minidl::nn
