#!/usr/bin/env python3
"""The reference beside bench_gpt_step: the same GPT-2 training step in PyTorch, on the same card, in the same run.

    python bench/torch_gpt_step.py                                  # GPT-2 124M, B 16, T 1024, eager then compiled
    python bench/torch_gpt_step.py --mode eager --steps 25 --json-out torch.json
    python bench/torch_gpt_step.py --device cpu --layers 2 --heads 2 --embd 64 --seq 32 --batch 2 --vocab 65

The model is nanoGPT's GPT-2 (pre-LayerNorm blocks, tanh GELU, causal attention, the head tied to the token
embedding, the vocabulary padded to a multiple of 64 as nanoGPT and minidl both do) trained as PyTorch users train
it: bf16 autocast, scaled_dot_product_attention restricted to its flash kernel, fused AdamW (lr 1e-3, weight decay
0.1 on the matrices), eager and under torch.compile. One random batch is repeated every step, as bench_gpt_step
--same-batch does, so the loss must fall. Each mode runs --warmup untimed steps (compilation happens there), then
--steps timed ones, each fenced by a synchronisation.

Printed per mode: min, median and max ms/step, tokens/s, MFU against the datasheet peak (by the device's name, or
--peak-tflops) and against --measured-tflops (the bf16 GEMM ceiling gpu_probe measured), and the loss of the first
and last timed step. --json-out writes one JSON object (every timed step's ms included) whole, then renames it.
FLOPs per token are nanoGPT's estimate (6 N + 12 L T C, N without the position embedding), the convention
minidl's MFU follows.

Without CUDA (--device cpu) it runs in f32 or bf16 on the CPU; a PyTorch without scaled_dot_product_attention or
torch.compile runs manual attention and reports the compiled mode as unavailable.

Exit status: 0, 2 on bad usage, 69 when PyTorch or the CUDA device is not there (scripts/gpu-run.sh tags it ENV).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

ENV_BROKEN = 69
DATASHEET_BF16_TFLOPS = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0), ("L40S", 362.1),
                         ("L4", 121.0), ("A10G", 70.0)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=12, help="Transformer blocks (default 12)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (default 12)")
    p.add_argument("--embd", type=int, default=768, help="embedding width (default 768)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--vocab", type=int, default=50257, help="vocabulary (default 50257, padded to 50304)")
    p.add_argument("--mode", choices=["eager", "compile"], action="append",
                   help="eager, compile, or both (the default; repeat the flag)")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per mode (default 10)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per mode (default 50)")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    p.add_argument("--amp", choices=["bf16", "off"], default="bf16", help="autocast dtype (default bf16)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="the datasheet's dense bf16 peak; default: by the device's name")
    p.add_argument("--measured-tflops", type=float, default=0.0,
                   help="the measured bf16 GEMM ceiling (gpu_probe --ceilings), for a second MFU")
    p.add_argument("--json-out", help="write one JSON object to this file")
    a = p.parse_args()
    for name in ("layers", "heads", "embd", "seq", "batch", "vocab", "steps"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: expected a positive number, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup: expected 0 or more, got {a.warmup}")
    if a.embd % a.heads:
        p.error(f"--embd {a.embd} is not a multiple of --heads {a.heads}")
    if a.device not in ("cuda", "cpu"):
        p.error(f"--device: expected cuda or cpu, got '{a.device}'")
    a.mode = a.mode or ["eager", "compile"]
    return a


def build(torch, a, padded_vocab):
    nn, F = torch.nn, torch.nn.functional
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = a.embd
            self.ln_1, self.ln_2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.c_attn, self.c_proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.c_fc, self.mlp_proj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, a.heads, C // a.heads).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:  # PyTorch before 2.0
                att = (q @ k.transpose(-2, -1)) / math.sqrt(C // a.heads)
                mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
                y = att.masked_fill(~mask, float("-inf")).softmax(-1) @ v
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(padded_vocab, a.embd), nn.Embedding(a.seq, a.embd)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.embd)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * a.layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.h:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # the tied head
            return F.cross_entropy(logits[..., :a.vocab].float().reshape(-1, a.vocab), targets.reshape(-1))

    return GPT(), sdpa is not None


def run_mode(torch, a, mode, device):
    torch.manual_seed(1337)
    padded = (a.vocab + 63) // 64 * 64
    model, has_sdpa = build(torch, a, padded)
    model = model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    fused = device.type == "cuda"
    try:
        opt = torch.optim.AdamW(groups, lr=1e-3, fused=fused)
    except (TypeError, RuntimeError):
        fused = False
        opt = torch.optim.AdamW(groups, lr=1e-3)
    step_model = model
    if mode == "compile":
        if not hasattr(torch, "compile"):
            return {"mode": mode, "unavailable": f"torch.compile is not in PyTorch {torch.__version__}"}
        step_model = torch.compile(model)
    g = torch.Generator().manual_seed(7)
    idx = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device)
    targets = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(device)
    amp = a.amp == "bf16"

    def attention_context():
        if device.type == "cuda" and has_sdpa:
            try:
                from torch.nn.attention import SDPBackend, sdpa_kernel
                return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
            except ImportError:
                pass
        import contextlib
        return contextlib.nullcontext()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step():
        with attention_context(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = step_model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    sync()
    ms, losses = [], []
    for i in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
        if i in (0, a.steps - 1):
            losses.append(float(loss))
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    flops_per_token = 6 * n_params + 12 * a.layers * a.seq * a.embd
    median = statistics.median(ms)
    tokens = a.batch * a.seq
    return {"mode": mode, "ms_min": min(ms), "ms_per_step": median, "ms_max": max(ms), "ms_steps": ms,
            "tokens_per_s": tokens / median * 1e3, "tflops": flops_per_token * tokens / median / 1e9,
            "loss_first": losses[0], "loss_last": losses[-1], "fused_adamw": fused,
            "attention": "sdpa (flash)" if has_sdpa and device.type == "cuda" else "sdpa" if has_sdpa else "manual"}


def main():
    a = parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"torch_gpt_step: PyTorch is not installed for {sys.executable}: {e}", file=sys.stderr)
        return ENV_BROKEN
    if a.device == "cuda" and not torch.cuda.is_available():
        print(f"torch_gpt_step: PyTorch {torch.__version__} sees no CUDA device "
              f"(built for CUDA {torch.version.cuda})", file=sys.stderr)
        return ENV_BROKEN
    device = torch.device(a.device)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = a.peak_tflops or next((t for match, t in DATASHEET_BF16_TFLOPS if match in name), 0.0)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    report = {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda, "peak_tflops": peak,
              "measured_tflops": a.measured_tflops,
              "config": {k: getattr(a, k) for k in ("layers", "heads", "embd", "seq", "batch", "vocab", "amp")},
              "warmup": a.warmup, "steps": a.steps, "modes": []}
    print(f"torch_gpt_step: PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {name}, "
          f"L{a.layers} H{a.heads} C{a.embd} T{a.seq} B{a.batch} V{a.vocab} {a.amp}, "
          f"{a.warmup} warm-up + {a.steps} timed steps per mode")
    print(f"{'mode':<8} {'min':>8} {'median':>8} {'max':>8} {'tokens/s':>10} {'MFU':>7} {'MFU(meas)':>9} loss")
    for mode in a.mode:
        r = run_mode(torch, a, mode, device)
        if "unavailable" not in r:
            r["mfu"] = r["tflops"] / peak if peak else None
            r["mfu_measured"] = r["tflops"] / a.measured_tflops if a.measured_tflops else None
            pct = lambda v: f"{100 * v:.1f}%" if v else "-"
            print(f"{mode:<8} {r['ms_min']:8.2f} {r['ms_per_step']:8.2f} {r['ms_max']:8.2f} "
                  f"{r['tokens_per_s']:10.0f} {pct(r['mfu']):>7} {pct(r['mfu_measured']):>9} "
                  f"{r['loss_first']:.4f} -> {r['loss_last']:.4f}", flush=True)
        else:
            print(f"{mode:<8} unavailable: {r['unavailable']}", flush=True)
        report["modes"].append(r)
    if a.json_out:
        with open(a.json_out + ".part", "w") as f:
            json.dump(report, f)
        os.replace(a.json_out + ".part", a.json_out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
