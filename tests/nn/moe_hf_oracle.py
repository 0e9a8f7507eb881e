"""transformers' own MixtralForCausalLM against what minidl's mixture of experts computed (tests/nn/test_moe_hf.cpp).

    python moe_hf_oracle.py CASE_DIR [CASE_DIR ...]   -> one JSON line per case on stdout

Each CASE_DIR holds what minidl's save_gpt writes (config.json, model_type mixtral, and model.safetensors under
MixtralForCausalLM's names and layouts) and minidl's results: ids.json ({"ids", "targets", "prompt", "greedy"}) and
outputs.safetensors (logits, loss (the cross-entropy), aux (the auxiliary loss summed over the layers), router.<i>
(layer i's router logits, (B T, E)) and every parameter's gradient of loss + aux under its HF name and layout).

The model is loaded with from_pretrained in f32 and run with output_router_logits. The auxiliary loss is
transformers' load_balancing_loss_func as 4.37 and later write it (softmax over every expert, then the top k;
4.36, the version pinned here, took the top k of the logits first and averaged the renormalised weights, which
makes it a constant), applied to each layer's router logits of each sequence, averaged over the sequences and
summed over the layers (minidl's per-sequence loss: nn/moe.h), times router_aux_loss_coef. Printed per case: max
|logits diff|, max |router logits diff|, |loss diff| / loss, |aux diff| / aux, the largest gradient difference
relative to that tensor's largest magnitude, the names missing on either side, and whether greedy tokens match.
"""
import json
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_hf_oracle import compare_gradients, compare_greedy, main  # noqa: E402


def load_balancing_loss_func(gate_logits, num_experts, top_k):
    """transformers >= 4.37's models/mixtral/modeling_mixtral.py load_balancing_loss_func, without an attention
    mask: the fraction of the tokens sent to each expert times its mean router probability, summed, times E."""
    concatenated_gate_logits = torch.cat(list(gate_logits), dim=0)
    routing_weights = torch.nn.functional.softmax(concatenated_gate_logits, dim=-1)
    _, selected_experts = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = torch.nn.functional.one_hot(selected_experts, num_experts)
    tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
    router_prob_per_expert = torch.mean(routing_weights, dim=0)
    overall_loss = torch.sum(tokens_per_expert * router_prob_per_expert.unsqueeze(0))
    return overall_loss * num_experts


def check(case):
    torch.manual_seed(0)
    with open(os.path.join(case, "config.json")) as f:
        cfg = json.load(f)
    model = transformers.MixtralForCausalLM.from_pretrained(case, torch_dtype=torch.float32)
    model.eval()
    with open(os.path.join(case, "ids.json")) as f:
        io = json.load(f)
    ours = load_file(os.path.join(case, "outputs.safetensors"))
    ids = torch.tensor(io["ids"], dtype=torch.long)
    targets = torch.tensor(io["targets"], dtype=torch.long)
    B, T = ids.shape
    out_hf = model(ids, output_router_logits=True)
    logits = out_hf.logits
    V = logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))
    E, k, coef = cfg["num_local_experts"], cfg["num_experts_per_tok"], cfg["router_aux_loss_coef"]
    aux = 0
    router_diff = 0.0
    for i, layer_logits in enumerate(out_hf.router_logits):
        per_sequence = [load_balancing_loss_func((layer_logits[b * T:(b + 1) * T],), E, k) for b in range(B)]
        aux = aux + coef * torch.stack(per_sequence).mean()
        router_diff = max(router_diff, (layer_logits.detach() - ours[f"router.{i}"]).abs().max().item())
    (loss + aux).backward()
    out = {
        "case": os.path.basename(case),
        "transformers": transformers.__version__,
        "logits_max_abs": (logits.detach() - ours["logits"]).abs().max().item(),
        "router_max_abs": router_diff,
        "loss_rel": abs(loss.item() - ours["loss"].item()) / abs(loss.item()),
        "aux_rel": abs(aux.item() - ours["aux"].item()) / max(abs(aux.item()), 1e-30),
        "aux": aux.item(),
    }
    out.update(compare_gradients(model, ours))
    out.update(compare_greedy(model, io))
    model.save_pretrained(os.path.join(case, "hf_saved"), safe_serialization=True)
    return out


if __name__ == "__main__":
    main(check)
