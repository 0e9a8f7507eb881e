#!/usr/bin/env python3
"""minidl_predict against published training runs: the predicted step time of each run's model and layout on the
machine it ran on, beside the step time the publication implies.

    bench/predict_published.py                 # build/bin/minidl_predict
    bench/predict_published.py --bin build42/bin --json

Rows (never invented; the sources are named in each row's note):
- Megatron-LM, Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", SC'21, arXiv:2104.04473), Table 1: GPT with V = 51,200, s = 2,048 on Selene (DGX A100 80GB, 8 per
  node, HDR InfiniBand), mixed precision, activation recomputation. The table gives teraFLOP/s per GPU X counted by
  the paper's formula F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) per iteration (recomputation included), so the
  implied step time is F / (n·X). Not in the table, assumed here: micro-batch 1 (M = B/dp micro-batches per
  pipeline), the non-interleaved 1F1B schedule, no ZeRO (Megatron's DDP), bf16 (the paper used fp16: same peak).
- llm.c (karpathy/llm.c), GPT-2 on one node of 8 GPUs: bf16 (llm.c's default PRECISION_MODE), the vocabulary
  padded to 50,304, no recomputation (-r 0), ZeRO-1 (-z 1), data parallelism over the 8 GPUs with -b sequences of
  -t 1,024 tokens per GPU per micro-batch and -d tokens per step, so -d / (8 · b · 1,024) micro-batches.
  - 124M on 8X A100 80GB SXM: scripts/run_gpt2_124M.sh at commit c6efd90a (the command of discussion #481,
    "Reproducing GPT-2 (124M) in llm.c in 90 minutes for $20"): d12 (12 layers, 12 heads, 768), -b 64 -t 1024
    -d 524288 (no accumulation), "on 8X A100 80GB SXM ($14/hr) steps in ~300ms/iter". The discussion's
    "~90 minutes" for 10B tokens (19,073 steps) is ~283 ms a step, the same within its rounding.
  - 124M on 8X H100: KellerJordan/modded-nanogpt records/track_1_short/2024-10-13_llmc/README.md (its "llm.c
    baseline"): llm.c as of October 13th 2024 "run on a node with 8x H100 HBM3 according to the instructions" of
    discussion #481, "The mean per-step time was 140ms"; its main.log has 19,560 steps, 10.26B tokens, i.e.
    524,288 a step. Taken as SXM (the h100-sxm preset), an assumption: "H100 80GB HBM3" is the name nvidia-smi
    gives the SXM part (the PCIe card is "H100 PCIe", the NVL "H100 NVL").
  - 1558M on 8X H100 80GB SXM: scripts/run_gpt2_1558M.sh at commit c6efd90a (the run of discussion #677, GPT-2
    1558M "on a single 8XH100 node in 24 hours, and for $672"): d48 (48 layers, 25 heads, 1,600), -b 16 -t 1024
    -d 1048576 (8 micro-batches), "on 8X H100 80GB SXM ($28/hr) steps in 2.80s/iter".
"""
import argparse
import json
import os
import subprocess
import sys

import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (billions, heads, hidden, layers, t, p, GPUs, batch, teraFLOP/s per GPU), Table 1 of arXiv:2104.04473.
MEGATRON_TABLE_1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

# llm.c runs on 8 GPUs: (row, machine, layers, heads, embd, -b, -d tokens per step, published s per step, quote).
LLMC = [
    ("llm.c GPT-2 124M, 8X A100 80GB SXM, -b 64, 524,288 tokens/step", "a100-sxm", 12, 12, 768, 64, 524288, 0.300,
     "scripts/run_gpt2_124M.sh: steps in ~300ms/iter"),
    ("llm.c GPT-2 124M, 8X H100, -b 64, 524,288 tokens/step", "h100-sxm", 12, 12, 768, 64, 524288, 0.140,
     "modded-nanogpt's llm.c baseline: mean per-step time 140ms"),
    ("llm.c GPT-2 1558M, 8X H100 80GB SXM, -b 16, 1,048,576 tokens/step", "h100-sxm", 48, 25, 1600, 16, 1048576,
     2.80, "scripts/run_gpt2_1558M.sh: steps in 2.80s/iter"),
]


def predict(binary, args):
    out = subprocess.run([binary] + [str(a) for a in args] + ["--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1]
    return json.loads(out.stdout), None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    binary = os.path.join(args.bin, "minidl_predict")
    if not os.path.exists(binary):
        sys.exit(f"predict_published: {binary} not found (build predict_program, or pass --bin)")
    rows = []
    V, s = 51200, 2048
    for (size, heads, h, l, t, p, n, B, X) in MEGATRON_TABLE_1:
        dp = n // (t * p)
        flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
        published = flops / (n * X * 1e12)
        pred, err = predict(binary, ["--machine", "a100-sxm", "--layers", l, "--heads", heads, "--embd", h, "--seq", s,
                                     "--vocab", V, "--batch", B, "--dp", dp, "--tp", t, "--pp", p, "--micro-batches",
                                     B // dp, "--recompute", "block", "--amp", "bf16"])
        rows.append({"row": f"Megatron-LM Table 1, {size}B, t={t} p={p}, {n} A100s, B={B}",
                     "published_s": published, "predicted_s": pred["step_ms"] / 1e3 if pred else None,
                     "note": err or f"{X} TFLOP/s per GPU published, {flops / (n * pred['step_ms'] / 1e3) / 1e12:.0f} "
                     "predicted; predicted breakdown (ms) " +
                     ", ".join(f"{k} {v:.0f}" for k, v in pred["breakdown_ms"].items() if v >= 0.5)})
    for (row, machine, layers, heads, embd, b, tokens, published, quote) in LLMC:
        micro = tokens // (8 * b * 1024)
        pred, err = predict(binary, ["--machine", machine, "--layers", layers, "--heads", heads, "--embd", embd,
                                     "--seq", 1024, "--vocab", 50257, "--batch", tokens // 1024, "--dp", 8,
                                     "--micro-batches", micro, "--zero", 1, "--amp", "bf16"])
        rows.append({"row": row, "published_s": published, "predicted_s": pred["step_ms"] / 1e3 if pred else None,
                     "note": err or f"{quote}; {100 * pred['mfu']:.0f}% MFU predicted"})
    for r in rows:
        r["error"] = (r["predicted_s"] - r["published_s"]) / r["published_s"] if r["predicted_s"] else None
    prov = provenance.provenance()
    if args.json:
        print(json.dumps({"provenance": prov, "rows": rows}, indent=1))
        return
    print(provenance.header(prov), end="")
    print(f"{'row':66} {'published_s':>11} {'predicted_s':>11} {'error':>7}")
    for r in rows:
        pred = f"{r['predicted_s']:.3f}" if r["predicted_s"] else "-"
        error = f"{100 * r['error']:+.0f}%" if r["error"] is not None else "-"
        print(f"{r['row']:66} {r['published_s']:11.3f} {pred:>11} {error:>7}")
        print(f"    {r['note']}")


if __name__ == "__main__":
    main()
