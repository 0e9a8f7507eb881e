"""transformers' own LlamaForCausalLM / GPT2LMHeadModel against what minidl computed (tests/nn/test_llama_hf.cpp).

    python llama_hf_oracle.py CASE_DIR [CASE_DIR ...]   -> one JSON line per case on stdout

Each CASE_DIR holds what minidl's --save writes (config.json and model.safetensors under HF's names and layouts)
and minidl's results: ids.json ({"ids": B x T, "targets": B x T, "prompt": [...], "greedy": [...]}) and
outputs.safetensors (logits (B, T, V), loss (1), and every parameter's gradient under its HF name, HF's layout).
The model is loaded with from_pretrained in f32 (the oracle runs transformers' code, not a copy of ours), the
same batch goes through it, backward, and greedy decoding with generate(do_sample=False). Printed per case:
max |logits diff|, |loss diff| / loss, the largest gradient difference relative to that tensor's largest magnitude,
the gradient names missing on either side, and whether the greedy tokens match.

rope_scaling llama3 predates some transformers versions (4.43 added it): there the config is loaded without it and
every layer's inv_freq is replaced by the published formula (the Llama 3.1 reference's apply_scaling), so the rest
of the model is still transformers' code. An explicit head_dim other than hidden_size / heads predates 4.45: there
each attention is rebuilt at the config's head_dim (head_dim_model), the rest again transformers' code.
"""
import json
import math
import os
import sys

import torch
import transformers
from safetensors.torch import load_file


def llama3_inv_freq(inv_freq, s):
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old / low, old / high
    out = []
    for f in inv_freq.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < high_wavelen:
            out.append(f)
        elif wavelen > low_wavelen:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


def head_dim_model(case, cfg, patch):
    """transformers before 4.45 derive head_dim as hidden_size / heads: each attention is given the config's own
    head_dim (its projections rebuilt at that width, its RoPE re-initialised, and the width it reshapes its output to
    set to heads x head_dim, the one place its forward uses hidden_size), then the file's tensors load strictly."""
    assert not patch
    D, H, KV, C = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k != "head_dim"})
    model = transformers.LlamaForCausalLM(config)
    for layer in model.model.layers:
        a = layer.self_attn
        a.head_dim, a.hidden_size = D, H * D
        a.q_proj = torch.nn.Linear(C, H * D, bias=False)
        a.k_proj = torch.nn.Linear(C, KV * D, bias=False)
        a.v_proj = torch.nn.Linear(C, KV * D, bias=False)
        a.o_proj = torch.nn.Linear(H * D, C, bias=False)
        a._init_rope()
    state = load_file(os.path.join(case, "model.safetensors"))
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    model.tie_weights()
    return model


def load(case):
    with open(os.path.join(case, "config.json")) as f:
        cfg = json.load(f)
    scaling = cfg.get("rope_scaling")
    patch = None
    if cfg["model_type"] == "llama" and scaling and scaling.get("rope_type") == "llama3":
        try:
            model = transformers.LlamaForCausalLM.from_pretrained(case, torch_dtype=torch.float32)
            return model, "native"
        except (ValueError, KeyError):
            patch = scaling
            cfg = dict(cfg, rope_scaling=None)
    head_dim = cfg.get("head_dim")
    if cfg["model_type"] == "llama" and head_dim and head_dim * cfg["num_attention_heads"] != cfg["hidden_size"] \
            and "head_dim" not in transformers.LlamaConfig().to_dict():
        return head_dim_model(case, cfg, patch), "head_dim"
    cls = transformers.LlamaForCausalLM if cfg["model_type"] == "llama" else transformers.GPT2LMHeadModel
    config = (transformers.LlamaConfig if cfg["model_type"] == "llama" else transformers.GPT2Config)(**cfg)
    model = cls.from_pretrained(case, config=config, torch_dtype=torch.float32)
    how = "native"
    if patch:
        how = "formula"
        for layer in model.model.layers:
            rot = layer.self_attn.rotary_emb
            rot.inv_freq = llama3_inv_freq(rot.inv_freq, patch)
            rot._set_cos_sin_cache(seq_len=rot.max_position_embeddings, device=rot.inv_freq.device,
                                   dtype=torch.float32)
    return model, how


def compare_gradients(model, ours):
    """The largest difference of a parameter's gradient (transformers' after backward, minidl's "grad.<HF name>" in
    `ours`) relative to that gradient's largest magnitude, its name, and the names either side lacks."""
    worst, worst_name, missing = 0.0, "", []
    params = dict(model.named_parameters())
    for name, p in params.items():
        if p.grad is None:
            continue
        key = "grad." + name
        if key not in ours:
            if name == "lm_head.weight" and model.config.tie_word_embeddings:
                continue  # tied: its gradient is the embedding's
            missing.append(name)
            continue
        rel = (p.grad - ours[key]).abs().max().item() / max(p.grad.abs().max().item(), 1e-30)
        if rel > worst:
            worst, worst_name = rel, name
    for key in ours:
        if key.startswith("grad.") and key[5:] not in params:
            missing.append("minidl:" + key[5:])
    return {"grad_max_rel": worst, "grad_worst": worst_name, "missing": missing}


def compare_greedy(model, io):
    """generate(do_sample=False) after io's prompt against minidl's greedy tokens."""
    prompt = torch.tensor([io["prompt"]], dtype=torch.long)
    with torch.no_grad():
        gen = model.generate(prompt, max_new_tokens=len(io["greedy"]), do_sample=False, pad_token_id=0,
                             eos_token_id=None)
    hf = gen[0, prompt.shape[1]:].tolist()
    return {"greedy_equal": hf == io["greedy"], "hf_greedy": hf}


def check(case):
    torch.manual_seed(0)
    with open(os.path.join(case, "config.json")) as f:
        cfg = json.load(f)
    model, rope = load(case)
    model.eval()
    with open(os.path.join(case, "ids.json")) as f:
        io = json.load(f)
    ours = load_file(os.path.join(case, "outputs.safetensors"))
    ids = torch.tensor(io["ids"], dtype=torch.long)
    targets = torch.tensor(io["targets"], dtype=torch.long)
    logits = model(ids).logits
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    loss.backward()
    ref = loss.item()
    out = {
        "case": os.path.basename(case),
        "rope": rope,
        "transformers": transformers.__version__,
        "logits_max_abs": (logits.detach() - ours["logits"]).abs().max().item(),
        "loss_rel": abs(ref - ours["loss"].item()) / abs(ref),
    }
    out.update(compare_gradients(model, ours))
    out.update(compare_greedy(model, io))
    # The other direction: what save_pretrained writes of this model (test_llama_hf.cpp loads it into minidl).
    saved = os.path.join(case, "hf_saved")
    model.save_pretrained(saved, safe_serialization=True)
    # ... sharded (model.safetensors.index.json and its shards), and in bf16.
    sharded, bf16 = os.path.join(case, "hf_sharded"), os.path.join(case, "hf_bf16")
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="100KB")
    model.to(torch.bfloat16).save_pretrained(bf16, safe_serialization=True)
    for folder in (saved, sharded, bf16):
        if rope in ("formula", "head_dim"):  # the config was loaded without what this transformers cannot read
            with open(os.path.join(folder, "config.json")) as f:
                written = json.load(f)
            written["rope_scaling"], written["head_dim"] = cfg.get("rope_scaling"), cfg.get("head_dim")
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(written, f, indent=2)
    return out


def main(check_case):
    """check_case over the folders on the command line, one JSON line each, whatever happens."""
    for case in sys.argv[1:]:
        try:
            print(json.dumps(check_case(case)), flush=True)
        except Exception as e:  # one line per case, whatever happened
            print(json.dumps({"case": os.path.basename(case), "error": f"{type(e).__name__}: {e}"}), flush=True)


if __name__ == "__main__":
    main(check)
