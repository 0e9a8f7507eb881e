// Hugging Face's side of a model file: tensor names, weight layouts and config.json, for GPT2LMHeadModel and
// LlamaForCausalLM, so what minidl writes loads with from_pretrained and what save_pretrained wrote loads here.
//
//   hf_tensor_name(cfg, "transformer.h.0.attn.q_proj.weight")  -> "model.layers.0.self_attn.q_proj.weight"
//   GPTConfig cfg = config_from_hf_json(read("dir/config.json"), "dir/config.json");
//   StateDict w = read_model_tensors("dir", cfg);            // minidl's names and layouts, f32
//
// GPT-2: minidl's names and (in, out) layout are HF's already; save_pretrained leaves out the tied lm_head.weight
// (or writes it: it is dropped) and may write the attention's mask buffers (attn.bias, attn.masked_bias: dropped).
// Llama: minidl's tree (nn/llama.h) maps name by name; HF's nn.Linear weights are (out, in), the transpose of
// minidl's, and the untied head lm_head.weight is (V, C) in both.
//
//   minidl                                 LlamaForCausalLM
//   transformer.wte.weight                 model.embed_tokens.weight
//   transformer.h.<i>.ln_1.weight          model.layers.<i>.input_layernorm.weight
//   transformer.h.<i>.attn.{q,k,v}_proj    model.layers.<i>.self_attn.{q,k,v}_proj     transposed
//   transformer.h.<i>.attn.c_proj          model.layers.<i>.self_attn.o_proj           transposed
//   transformer.h.<i>.ln_2.weight          model.layers.<i>.post_attention_layernorm.weight
//   transformer.h.<i>.mlp.{gate,up}_proj   model.layers.<i>.mlp.{gate,up}_proj         transposed
//   transformer.h.<i>.mlp.c_proj           model.layers.<i>.mlp.down_proj              transposed
//   transformer.ln_f.weight                model.norm.weight
//   lm_head.weight                         lm_head.weight
// An MoE block (nn/moe.h) as MixtralForCausalLM's, its shared expert as Qwen2-MoE's:
//   transformer.h.<i>.moe.router           model.layers.<i>.block_sparse_moe.gate                  transposed
//   ...moe.experts.<j>.{gate,up,c}_proj    ...block_sparse_moe.experts.<j>.{w1,w3,w2}             transposed
//   ...moe.shared.{gate,up,c}_proj         ...block_sparse_moe.shared_expert.{gate,up,down}_proj  transposed
//
// q and k are stored in the rotate_half order HF uses (no permutation): a Meta-format checkpoint, whose q and k
// rows are interleaved pairs, must be converted by HF's convert_llama_weights_to_hf.py first.
#pragma once

#include <string>

#include "nn/gpt.h"
#include "nn/module.h"

namespace minidl::nn {

// The name a minidl parameter has in HF's model, and whether its tensor is stored transposed there.
std::string hf_tensor_name(const GPTConfig& cfg, const std::string& name);
bool hf_transposed(const GPTConfig& cfg, const std::string& name);
// The inverse: HF's name -> minidl's, or "" for a tensor HF keeps that minidl does not (GPT-2's attention mask
// buffers, a tied lm_head.weight); throws naming an unexpected one.
std::string minidl_tensor_name(const GPTConfig& cfg, const std::string& hf_name);

// Whether transformers has a class computing what cfg does: every dense model; a mixture of experts that is a
// Mixtral (the softmax router with k > 1, every block MoE, no shared expert, dropless, no bias balancing, Mixtral's
// head_dim and no rope_scaling).
bool hf_expressible(const GPTConfig& cfg);
// config.json as from_pretrained reads it for cfg (GPT2LMHeadModel, LlamaForCausalLM or MixtralForCausalLM); throws
// unless hf_expressible(cfg).
std::string hf_config_json(const GPTConfig& cfg);
// A config.json (model_type gpt2 or llama) -> GPTConfig; `source` names it in messages. Refuses, naming the field
// and what was expected, what minidl cannot run exactly (an unknown rope_type, biases in a Llama, a hidden
// activation other than the architecture's).
GPTConfig config_from_hf_json(const std::string& text, const std::string& source);

// The tensors of a model file or folder under minidl's names and layouts, as f32: `path` is a safetensors file
// (minidl's own, or a model.safetensors), or a folder as save_pretrained writes it (model.safetensors, or
// model.safetensors.index.json and its shards). Tensors HF keeps that minidl does not (GPT-2's mask buffers, a
// tied lm_head) are dropped; every other name must be one of cfg's parameters. An MoE block's expert bias (a buffer)
// is read where the file has it, else 0.
StateDict read_model_tensors(const std::string& path, const GPTConfig& cfg);

}  // namespace minidl::nn
