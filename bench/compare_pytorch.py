#!/usr/bin/python3
"""Time one GPT or Llama training step in PyTorch and in minidl, same model and recipe, and print both side by side.

Usage (Debian's /usr/bin/python3 has PyTorch once `scripts/install-deps.sh --with-torch` has run):

    /usr/bin/python3 bench/compare_pytorch.py                         # baby config, threads 1 and 2
    /usr/bin/python3 bench/compare_pytorch.py --config nanogpt --threads 2 --steps 10 --warmup 3
    /usr/bin/python3 bench/compare_pytorch.py --config custom --layers 2 --heads 2 --embd 64 --seq 32 --batch 4
    /usr/bin/python3 bench/compare_pytorch.py --json                  # one JSON object instead of the table
    /usr/bin/python3 bench/compare_pytorch.py --isa avx2              # minidl's AVX2 kernels (MINIDL_CPU_ISA)
    /usr/bin/python3 bench/compare_pytorch.py --rounds 3              # the two in turns, 3 times: medians
    /usr/bin/python3 bench/compare_pytorch.py --model llama --rounds 3  # Llama: baby sizes, kv-heads 2, ffn 344

Model and recipe (both sides): nanoGPT-style GPT-2 with learned position embeddings, pre-LayerNorm blocks,
causal self-attention, GELU(tanh), biases everywhere except the output head, which shares its weight with the
token embedding; dropout 0; vocabulary 65 (the characters of Tiny Shakespeare); init N(0, 0.02) with residual
projections scaled by 1/sqrt(2 * layers); AdamW lr 1e-3, betas (0.9, 0.999), weight decay 0.1 on parameters
with dim >= 2 only. Batches are windows of data/tinyshakespeare.txt (the corpus shipped in the repository,
training split) when that file exists, random tokens otherwise; timing does not depend on the values.

--model llama (nn/llama.h on the minidl side) swaps the blocks: RMSNorm (in f32, eps 1e-5, weight 1) before the
attention and the MLP and at the end, no position table but RoPE (rotate_half, Hugging Face's layout, theta 1e4)
on q and k, grouped-query attention (q_proj C -> H*D, k_proj and v_proj C -> KV*D, each key/value head serving
H/KV query heads; o_proj, named c_proj, H*D -> C), a SwiGLU MLP down(silu(gate(x)) * up(x)) of width I, no
biases anywhere; the head is still tied to the token embedding, and init, AdamW and data are as above (the
residual projections o_proj and down_proj are the c_proj scaled by 1/sqrt(2 * layers)). Its shape is the
preset's, plus --kv-heads (default heads / 2 where heads is even, else heads) and --ffn (default 8/3 * embd
rounded up to a multiple of 8): for baby layers 4, heads 4, kv-heads 2, embd 128, ffn 344, seq 64, batch 12.

Measurement: one step = forward + loss + backward + optimizer step + zero_grad. ms/step is the median over
--steps timed steps after --warmup untimed ones. With --rounds R the PyTorch and minidl runs alternate, R times at
each thread count; each row is then the configuration's median run and the ratio the median over rounds of the
ratio within each round (a 2-vCPU Zen 4 VM ran both 1.5x slower in some minutes than in others, which put the
single-round baby ratio anywhere from 0.41 to 0.83). Each PyTorch thread count runs in its own subprocess (with
torch.set_num_threads(n) and OMP_NUM_THREADS=n), so peak_MB is that configuration's peak resident set size
(getrusage ru_maxrss; it includes the Python interpreter and libtorch). minidl's row is what
`bench_gpt_step --json` reports (its peak_mem_mb), for the same shapes and thread count.

FLOP count (nanoGPT's estimate_mfu, the formula minidl's bench_gpt_step also uses):

    N               = number of parameters, counting the tied embedding once and excluding the position
                      embedding (wpe); for Llama per layer C*H*Q (q) + 2*C*KV*Q (k, v) + H*Q*C (o)
                      + 3*C*I (MLP) + 2*C (norms), then C (final norm) + V*C (the tied embedding)
    flops_per_token = 6*N + 12*L*H*Q*T        L layers, H heads, Q = C/H head size, T sequence length
    flops_per_step  = flops_per_token * B*T   B batch size
    GFLOP/s         = flops_per_step / (ms_per_step / 1000) / 1e9

Ceiling (minidl rows): the sgemm ceiling at the step's own shapes, which bench_gpt_step measures in the same run:
the forward, input-gradient and weight-gradient products of every linear layer, each timed alone with
single-threaded OpenBLAS, total FLOPs / total time, times the thread count (bench/sgemm_ceiling.h). It is measured
in rounds between groups of 5 steps; the column is the median round, and %ceil the median over steps of the
step's GFLOP/s (the formula above) over the rounds around it, so a machine whose speed drifts during the run
compares each step with what the GEMMs reached at that time. For --model llama the ceiling's products are still
GPT-2's linear layers at the same width (C -> 3C, C -> C, C -> 4C, 4C -> C: ops/sgemm_ceiling.h knows no other),
so there %ceil only roughly says how close the step comes. --isa sets MINIDL_CPU_ISA for minidl; OpenBLAS (minidl's and, through
its own build, PyTorch's) picks its kernels from the CPU or OPENBLAS_CORETYPE, which is passed through as set.

Exit status: 0 on success (also when the minidl binary is missing: its rows are then left out), 1 when a run
failed, 2 when PyTorch cannot be imported.
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import provenance

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO_ROOT, "data", "tinyshakespeare.txt")
VOCAB_SIZE = 65
CONFIGS = {
    "baby": dict(layers=4, heads=4, embd=128, seq=64, batch=12),
    "nanogpt": dict(layers=6, heads=6, embd=384, seq=256, batch=8),
}


def flops_per_step(n_params_no_wpe, shape):
    L, H, C, T, B = shape["layers"], shape["heads"], shape["embd"], shape["seq"], shape["batch"]
    head_size = C // H
    flops_per_token = 6 * n_params_no_wpe + 12 * L * H * head_size * T
    return flops_per_token * B * T


def count_params_no_wpe(model, shape):
    """The parameter count N of the formula above, for the model built by pytorch_worker."""
    L, H, C = shape["layers"], shape["heads"], shape["embd"]
    if model == "llama":
        D, KV, I = C // H, shape["kv_heads"], shape["ffn"]
        per_block = (C * H * D + 2 * C * KV * D   # q_proj; k_proj, v_proj
                     + H * D * C                  # o_proj (attn.c_proj)
                     + 3 * C * I                  # gate_proj, up_proj, down_proj (mlp.c_proj)
                     + 2 * C)                     # the two RMSNorms
        return VOCAB_SIZE * C + L * per_block + C  # wte (tied with lm_head), blocks, the final norm
    per_block = (2 * 2 * C                        # ln_1, ln_2
                 + C * 3 * C + 3 * C              # attn.c_attn
                 + C * C + C                      # attn.c_proj
                 + C * 4 * C + 4 * C              # mlp.c_fc
                 + 4 * C * C + C)                 # mlp.c_proj
    return VOCAB_SIZE * C + L * per_block + 2 * C  # wte (tied with lm_head), blocks, ln_f


# ---------------------------------------------------------------- PyTorch side (runs in a subprocess)

def pytorch_worker(model_name, shape, threads, steps, warmup):
    """Times `steps` training steps at `threads` threads; returns the row as a dict."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    L, H, C, T, B = shape["layers"], shape["heads"], shape["embd"], shape["seq"], shape["batch"]

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(C, 3 * C)
            self.c_proj = nn.Linear(C, C)
            self.flash = hasattr(F, "scaled_dot_product_attention")  # PyTorch >= 2.0
            if not self.flash:
                self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

        def forward(self, x):  # x: (B, T, C)
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))  # (B, H, T, Q)
            if self.flash:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
                att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(C), CausalSelfAttention()
            self.ln_2 = nn.LayerNorm(C)
            self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(C, 4 * C), c_proj=nn.Linear(4 * C, C)))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB_SIZE, C), nn.Embedding(T, C)
            self.h = nn.ModuleList(Block() for _ in range(L))
            self.ln_f = nn.LayerNorm(C)
            self.lm_head = nn.Linear(C, VOCAB_SIZE, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)
                elif name.endswith(".bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):  # idx, targets: (B, T)
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB_SIZE), targets.view(-1))

    class RMSNorm(nn.Module):
        def __init__(self, eps=1e-5):
            super().__init__()
            self.weight, self.eps = nn.Parameter(torch.ones(C)), eps

        def forward(self, x):  # in f32 (the model is f32 throughout), then the weight
            x = x.float()
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def rotate_half(x):  # Hugging Face's layout: the head's first and second halves pair up
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)

    class LlamaAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.kv, self.d = shape["kv_heads"], C // H
            self.q_proj = nn.Linear(C, H * self.d, bias=False)
            self.k_proj = nn.Linear(C, self.kv * self.d, bias=False)
            self.v_proj = nn.Linear(C, self.kv * self.d, bias=False)
            self.c_proj = nn.Linear(H * self.d, C, bias=False)  # o_proj
            inv_freq = 1.0 / (10000.0 ** (torch.arange(0, self.d, 2, dtype=torch.float32) / self.d))
            angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
            angles = torch.cat((angles, angles), dim=-1)  # (T, D)
            self.register_buffer("cos", angles.cos())
            self.register_buffer("sin", angles.sin())
            self.flash = hasattr(F, "scaled_dot_product_attention")  # PyTorch >= 2.0
            if not self.flash:
                self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T))

        def forward(self, x):  # x: (B, T, C)
            b, t, _ = x.shape
            q = self.q_proj(x).view(b, t, H, self.d).transpose(1, 2)  # (B, H, T, D)
            k = self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)  # (B, KV, T, D)
            v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
            cos, sin = self.cos[:t], self.sin[:t]
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            # Query head h reads key/value head h // (H / KV) (transformers' repeat_kv).
            k, v = k.repeat_interleave(H // self.kv, dim=1), v.repeat_interleave(H // self.kv, dim=1)
            if self.flash:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.d))
                att = att.masked_fill(~self.mask[:, :, :t, :t], float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, H * self.d))

    class LlamaBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.attn = RMSNorm(), LlamaAttention()
            self.ln_2 = RMSNorm()
            I = shape["ffn"]
            self.mlp = nn.ModuleDict(dict(gate_proj=nn.Linear(C, I, bias=False), up_proj=nn.Linear(C, I, bias=False),
                                          c_proj=nn.Linear(I, C, bias=False)))  # c_proj: down_proj

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            m = self.ln_2(x)
            return x + self.mlp.c_proj(F.silu(self.mlp.gate_proj(m)) * self.mlp.up_proj(m))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(VOCAB_SIZE, C)
            self.h = nn.ModuleList(LlamaBlock() for _ in range(L))
            self.ln_f = RMSNorm()
            self.lm_head = nn.Linear(C, VOCAB_SIZE, bias=False)
            self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():  # GPT's rule; the norms' weights stay 1
                if name.endswith("c_proj.weight"):
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
                elif p.dim() >= 2:
                    nn.init.normal_(p, 0.0, 0.02)

        def forward(self, idx, targets):  # idx, targets: (B, T)
            x = self.wte(idx)
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, VOCAB_SIZE), targets.view(-1))

    model = Llama() if model_name == "llama" else GPT()
    params = list(model.parameters())  # the tied weight appears once
    n_params_no_wpe = sum(p.numel() for p in params) - (model.wpe.weight.numel() if model_name == "gpt2" else 0)
    assert n_params_no_wpe == count_params_no_wpe(model_name, shape), "parameter count formula out of date"
    optimizer = torch.optim.AdamW(
        [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
         {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
        lr=1e-3, betas=(0.9, 0.999))

    if os.path.exists(CORPUS):
        with open(CORPUS, "rb") as f:
            text = f.read()
        chars = sorted(set(text))
        assert len(chars) == VOCAB_SIZE, f"{CORPUS}: expected {VOCAB_SIZE} distinct bytes, got {len(chars)}"
        lut = torch.zeros(256, dtype=torch.long)
        lut[torch.tensor(chars)] = torch.arange(VOCAB_SIZE)
        tokens = lut[torch.frombuffer(bytearray(text[: int(0.9 * len(text))]), dtype=torch.uint8).long()]
        data = "tinyshakespeare"
    else:
        tokens = torch.randint(0, VOCAB_SIZE, (100_000,))
        data = "random tokens"
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(warmup + steps):
        starts = torch.randint(0, len(tokens) - T - 1, (B,), generator=gen)
        window = torch.stack([tokens[s: s + T + 1] for s in starts.tolist()])
        batches.append((window[:, :-1].contiguous(), window[:, 1:].contiguous()))

    times_ms, loss = [], None
    for i, (x, y) in enumerate(batches):
        t0 = time.perf_counter()
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            times_ms.append((time.perf_counter() - t0) * 1e3)

    ms = statistics.median(times_ms)
    flops = flops_per_step(n_params_no_wpe, shape)
    return dict(impl="pytorch", model=model_name, threads=threads, ms_per_step=ms, tokens_per_s=B * T / (ms / 1e3),
                gflops=flops / (ms / 1e3) / 1e9,
                peak_mem_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                final_loss=loss.item(), data=data, torch_version=torch.__version__)


def run_pytorch(model, shape, threads, steps, warmup):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    spec = json.dumps(dict(model=model, shape=shape, threads=threads, steps=steps, warmup=warmup))
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--pytorch-worker", spec],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"PyTorch run at {threads} thread(s) failed (exit {proc.returncode}):\n{proc.stderr.strip()}"
    return json.loads(proc.stdout.strip().splitlines()[-1]), None


# ---------------------------------------------------------------- minidl side

def run_minidl(binary, model, shape, threads, steps, warmup, isa):
    cmd = [binary, "--layers", shape["layers"], "--heads", shape["heads"], "--embd", shape["embd"],
           "--seq", shape["seq"], "--batch", shape["batch"], "--threads", threads,
           "--steps", steps, "--warmup", warmup, "--json"]
    if model == "llama":  # flags bench_gpt_step has only since the Llama rows: the GPT-2 command is unchanged
        cmd += ["--model", "llama", "--kv-heads", shape["kv_heads"], "--ffn", shape["ffn"]]
    cmd = [str(c) for c in cmd]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if isa:
        env["MINIDL_CPU_ISA"] = isa
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return None, f"`{' '.join(cmd)}` failed (exit {proc.returncode}):\n{(proc.stderr or proc.stdout).strip()}"
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
        model_run = result.get("model", "gpt2")  # an older binary without --model says nothing: GPT-2
        if model_run != model:
            return None, f"`{' '.join(cmd)}` ran model {model_run!r}, not {model!r}"
        row = dict(impl="minidl", model=model_run, threads=threads, ms_per_step=float(result["ms_per_step"]),
                   tokens_per_s=float(result["tokens_per_s"]), gflops=float(result["gflops"]),
                   peak_mem_mb=float(result["peak_mem_mb"]),
                   sgemm_ceiling_gflops=float(result.get("sgemm_ceiling_gflops", 0.0)),
                   pct_ceiling=float(result.get("pct_ceiling", 0.0)))
    except (IndexError, ValueError, KeyError, TypeError) as e:
        return None, f"`{' '.join(cmd)}`: last stdout line is not the expected JSON object ({e!r})"
    return row, None


# ---------------------------------------------------------------- driver

def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See the module docstring for the model, recipe and FLOP formula.")
    p.add_argument("--config", choices=["baby", "nanogpt", "custom"], default="baby")
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2",
                   help="architecture, both sides (default: gpt2; llama: see the module docstring)")
    for name in ("layers", "heads", "embd", "seq", "batch"):
        p.add_argument(f"--{name}", type=int, help="shape for --config custom (overrides a preset's value)")
    p.add_argument("--kv-heads", type=int,
                   help="--model llama: key/value heads, a divisor of --heads (default: heads / 2 if even, else heads)")
    p.add_argument("--ffn", type=int,
                   help="--model llama: the SwiGLU MLP's width (default: 8/3 * embd rounded up to a multiple of 8)")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default: 1,2)")
    p.add_argument("--steps", type=int, default=20, help="timed steps (default: 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before them (default: 5)")
    p.add_argument("--minidl-bin", default=os.path.join(REPO_ROOT, "build", "bin", "bench_gpt_step"))
    p.add_argument("--isa", choices=["best", "avx512", "avx2", "sse4"],
                   help="MINIDL_CPU_ISA for the minidl runs (default: the environment's, else best)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run PyTorch and minidl in turns this many times at each thread count and report each "
                        "configuration's median run and the median ratio (default: 1); on a VM whose speed "
                        "changes from minute to minute, 3 compares the two in the same stretches of time")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args()

    shape = dict(CONFIGS.get(args.config, {}))
    for name in ("layers", "heads", "embd", "seq", "batch"):
        if getattr(args, name) is not None:
            shape[name] = getattr(args, name)
    missing = [n for n in ("layers", "heads", "embd", "seq", "batch") if n not in shape]
    if missing:
        p.error("--config custom needs " + ", ".join(f"--{n}" for n in missing))
    if any(v <= 0 for v in shape.values()) or shape["embd"] % shape["heads"]:
        p.error(f"shape must be positive with embd divisible by heads, got {shape}")
    if args.model == "llama":
        heads = shape["heads"]
        shape["kv_heads"] = args.kv_heads if args.kv_heads is not None else (heads // 2 if heads % 2 == 0 else heads)
        shape["ffn"] = args.ffn if args.ffn is not None else (8 * shape["embd"] // 3 + 7) // 8 * 8
        if shape["kv_heads"] <= 0 or heads % shape["kv_heads"] or shape["ffn"] <= 0:
            p.error(f"--kv-heads must divide --heads and --ffn be positive, got {shape}")
        if (shape["embd"] // heads) % 2:
            p.error(f"--model llama: RoPE needs an even head size embd / heads, got {shape['embd'] // heads}")
    elif args.kv_heads is not None or args.ffn is not None:
        p.error("--kv-heads and --ffn need --model llama")
    try:
        args.thread_counts = [int(t) for t in args.threads.split(",")]
        assert all(t > 0 for t in args.thread_counts)
    except (ValueError, AssertionError):
        p.error(f"--threads expects positive integers separated by commas, got '{args.threads}'")
    if args.steps < 1 or args.warmup < 0 or args.rounds < 1:
        p.error(f"--steps and --rounds must be >= 1 and --warmup >= 0, got --steps {args.steps} --rounds "
                f"{args.rounds} --warmup {args.warmup}")
    args.shape = shape
    return args


def best(rows):
    return min(rows, key=lambda r: r["ms_per_step"]) if rows else None


def print_table(args, rows, notes, ratio):
    s = args.shape
    n_params = count_params_no_wpe(args.model, s)
    flops = flops_per_step(n_params, s)
    print(provenance.header(provenance.provenance()), end="")
    if args.model == "llama":
        print(f"# Llama {args.config}: layers {s['layers']}, heads {s['heads']}, kv-heads {s['kv_heads']}, "
              f"embd {s['embd']}, ffn {s['ffn']}, seq {s['seq']}, batch {s['batch']}; {n_params / 1e6:.2f}M "
              f"params, {flops / 1e9:.3f} GFLOP/step")
    else:
        print(f"# GPT {args.config}: layers {s['layers']}, heads {s['heads']}, embd {s['embd']}, seq {s['seq']}, "
              f"batch {s['batch']}; {n_params / 1e6:.2f}M params (excl. wpe), {flops / 1e9:.3f} GFLOP/step")
    print(f"# median of {args.steps} timed steps after {args.warmup} warmup; * = best thread count per impl")
    isa = args.isa or os.environ.get("MINIDL_CPU_ISA", "best")
    print(f"# cpu: {provenance.cpu_name()}; minidl ISA: {isa}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
    print(f"{'impl':<8} {'threads':>7} {'ms/step':>10} {'tokens/s':>10} {'GFLOP/s':>9} {'peak_MB':>9} "
          f"{'ceiling':>9} {'%ceil':>6}")
    for impl in ("pytorch", "minidl"):
        impl_rows = [r for r in rows if r["impl"] == impl]
        for r in impl_rows:
            mark = " *" if r is best(impl_rows) and len(impl_rows) > 1 else ""
            ceiling = r.get("sgemm_ceiling_gflops", 0.0)
            ceil_cols = f"{ceiling:>9.1f} {r['pct_ceiling']:>5.0f}%" if ceiling else f"{'-':>9} {'-':>6}"
            print(f"{r['impl']:<8} {r['threads']:>7} {r['ms_per_step']:>10.2f} {r['tokens_per_s']:>10.0f} "
                  f"{r['gflops']:>9.2f} {r['peak_mem_mb']:>9.1f} {ceil_cols}{mark}")
    print(f"minidl/pytorch ms/step at best thread counts: "
          + (f"{ratio:.2f}" if ratio is not None else "n/a (no minidl result)"))
    for note in notes:
        print("# " + note.replace("\n", "\n#   "))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--pytorch-worker":
        spec = json.loads(sys.argv[2])
        print(json.dumps(pytorch_worker(spec["model"], spec["shape"], spec["threads"], spec["steps"],
                                        spec["warmup"])))
        return 0

    args = parse_args()
    try:
        import torch  # noqa: F401  (only checks that the workers will be able to import it)
    except ImportError as e:
        print(f"compare_pytorch: cannot import torch with {sys.executable} ({e}).\n"
              f"Install it with `scripts/install-deps.sh --with-torch` and run this script with "
              f"/usr/bin/python3 (Debian's python3-torch).", file=sys.stderr)
        return 2

    rows, notes, failed = [], [], False
    have_minidl = os.path.isfile(args.minidl_bin)
    if not have_minidl:
        notes.append(f"minidl: {args.minidl_bin} not found, so no minidl rows (build it with scripts/build.sh)")
    flops = flops_per_step(count_params_no_wpe(args.model, args.shape), args.shape)
    runs = {}  # (impl, threads) -> that configuration's row from every round
    round_ratios = []
    for _ in range(args.rounds):
        round_rows = []
        for t in args.thread_counts:
            row, err = run_pytorch(args.model, args.shape, t, args.steps, args.warmup)
            if err:
                notes.append(err)
                failed = True
            else:
                round_rows.append(row)
            if not have_minidl:
                continue
            row, err = run_minidl(args.minidl_bin, args.model, args.shape, t, args.steps, args.warmup, args.isa)
            if err:
                notes.append(err)
                failed = True
                continue
            round_rows.append(row)
            expected = flops / (row["ms_per_step"] / 1e3) / 1e9
            if abs(row["gflops"] - expected) > 0.02 * expected:
                notes.append(f"minidl at {t} thread(s) reports {row['gflops']:.2f} GFLOP/s but the formula above "
                             f"gives {expected:.2f} for its ms/step: the two FLOP counts disagree")
        for row in round_rows:
            runs.setdefault((row["impl"], row["threads"]), []).append(row)
        best_pt = best([r for r in round_rows if r["impl"] == "pytorch"])
        best_md = best([r for r in round_rows if r["impl"] == "minidl"])
        if best_pt and best_md:
            round_ratios.append(best_md["ms_per_step"] / best_pt["ms_per_step"])
    # Each configuration's row is its median run; the ratio is the median over rounds of the ratio within a round.
    for impl in ("pytorch", "minidl"):
        for t in args.thread_counts:
            done = sorted(runs.get((impl, t), []), key=lambda r: r["ms_per_step"])
            if done:
                rows.append(done[(len(done) - 1) // 2])
    pytorch_rows = [r for r in rows if r["impl"] == "pytorch"]
    if pytorch_rows:
        notes.append(f"PyTorch {pytorch_rows[0]['torch_version']}, data: {pytorch_rows[0]['data']}; PyTorch peak_MB "
                     f"is the process's max RSS (includes the interpreter and libtorch)")
    if args.model == "llama" and have_minidl:
        notes.append("minidl's ceiling is at GPT-2's linear-layer shapes of the same width (ops/sgemm_ceiling.h), "
                     "not Llama's, so its %ceil is only a rough guide")
    ratio = statistics.median(round_ratios) if round_ratios else None
    if args.rounds > 1:
        notes.append(f"{args.rounds} rounds, PyTorch and minidl alternating at each thread count: each row is the "
                     f"median run, the ratio the median of the rounds' ratios ("
                     + ", ".join(f"{x:.2f}" for x in round_ratios) + ")")
        # The spread says how much a single run's %ceil can be trusted on a machine whose speed drifts.
        spread = [f"{t} thread{'s' if t > 1 else ''} " + ", ".join(f"{r['pct_ceiling']:.0f}%" for r in runs[("minidl", t)])
                  for t in args.thread_counts if runs.get(("minidl", t)) and runs[("minidl", t)][0]["pct_ceiling"]]
        if spread:
            notes.append("minidl's %ceil in each round: " + "; ".join(spread))

    if args.json:
        print(json.dumps(dict(provenance=provenance.provenance(), model=args.model, config=args.config, cpu=provenance.cpu_name(),
                              shape=args.shape, steps=args.steps,
                              warmup=args.warmup, rounds=args.rounds, rows=rows,
                              ratio_minidl_over_pytorch_ms_per_step=ratio, round_ratios=round_ratios, notes=notes),
                         indent=2))
    else:
        print_table(args, rows, notes, ratio)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
