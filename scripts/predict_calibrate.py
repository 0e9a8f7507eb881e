#!/usr/bin/env python3
"""Calibrate the scaling predictor's "cpu-host" machine on this computer (about half a minute) and write it as
predict/presets/cpu-host.json, which minidl_predict --machine cpu-host reads.

    scripts/predict_calibrate.py                       # build/bin, writes predict/presets/cpu-host.json
    scripts/predict_calibrate.py --bin build42/bin --out /tmp/host.json

A "GPU" of this machine is one rank with one thread (one core); a node is the host, with as many ranks as cores.
Each number comes from a benchmark of the machine, never from a training step's time:
- peak FLOP/s: the sgemm ceiling at a GPT step's own linear-layer shapes, one thread (bench_gpt_step's
  sgemm_ceiling_gflops, bench/sgemm_ceiling.h), the median of 5 runs; products then run at efficiency 1 against it;
- memory bandwidth: the parallel copy bench_cpu_ops times beside its ops (one thread, arrays of --numel floats);
  the elementwise efficiency is the median over the step's memory-bound ops (layer norm, bias + GELU,
  cross-entropy, AdamW, forward and backward) of their GB/s over that copy's;
- attention: bench_cpu_ops' attention_fwd_bwd GFLOP/s counts the 7 causal tile products (7·B·T²·C); nanoGPT's
  count, which the predictor uses, is 12·B·T²·C, so the efficiency is GFLOP/s · 12/7 over the sgemm ceiling;
- links: mpirun -n 2 bench_collectives --backend mpi for each of all_reduce, reduce_scatter, all_gather and
  all_to_all (expert parallelism's exchange, the pairwise formula: the reduce-scatter's at n = 2), each
  fitted by least squares to its ring formula (predict/collectives.h) at n = 2: t = 2α + S/β for the all-reduce,
  t = α + S/(2β) for the others (S the full buffer). The all-reduce's is the host's link ("intra"); each
  collective's own is kept under "collectives", which the predictor uses for that collective within the host
  (Open MPI's reduce-scatter here moves a byte several times slower than its all-reduce). There is one host, so the
  inter-node link is set to the all-reduce's values (a second host was not measured).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEM_OPS = ["layernorm", "layernorm_backward", "bias_gelu", "bias_gelu_backward", "cross_entropy",
           "cross_entropy_backward", "adamw"]


def run(cmd, env=None):
    full_env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                    **(env or {}))
    out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", env=full_env)
    if out.returncode != 0:
        sys.exit(f"predict_calibrate: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return out.stdout


def last_json(text):
    return json.loads(text.strip().splitlines()[-1])


# The 2-rank ring's t = k_alpha·α + k_beta·S/β for each collective (predict/collectives.h at n = 2).
RING_AT_2 = {"all_reduce": (2, 1.0), "reduce_scatter": (1, 0.5), "all_gather": (1, 0.5), "all_to_all": (1, 0.5)}


def fit_alpha_beta(rows, op="all_reduce"):
    """Least squares of t = a + S·c over (size, time) rows; α = a / k_alpha and β = k_beta / c."""
    xs = [r["size"] for r in rows]
    ts = [r["time"] * 1e-6 for r in rows]  # bench_collectives prints µs, as nccl-tests
    mx, mt = statistics.fmean(xs), statistics.fmean(ts)
    c = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sum((x - mx) ** 2 for x in xs)
    a = mt - c * mx
    k_alpha, k_beta = RING_AT_2[op]
    return max(a, 0.0) / k_alpha, k_beta / c


def cpu_name():
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return "{} (family {} model {})".format(fields.get("Model name", "?").strip(),
                                                fields.get("CPU family", "?").strip(), fields.get("Model", "?").strip())
    except OSError:
        return "unknown CPU"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"), help="folder of the bench programs")
    ap.add_argument("--out", default=os.path.join(ROOT, "predict", "presets", "cpu-host.json"))
    ap.add_argument("--numel", type=int, default=4 << 20, help="floats per array of the memory-bound ops")
    args = ap.parse_args()
    binary = lambda name: os.path.join(args.bin, name)
    for name in ("bench_gpt_step", "bench_cpu_ops", "bench_collectives"):
        if not os.path.exists(binary(name)):
            sys.exit(f"predict_calibrate: {binary(name)} not found (build it, or pass --bin)")

    # The median of 5 runs: one run's ceiling moves by 10-20% on a shared machine.
    peak = statistics.median(
        last_json(run([binary("bench_gpt_step"), "--threads", "1", "--steps", "2", "--warmup", "1",
                       "--ceiling-every", "1", "--json"]))["sgemm_ceiling_gflops"] for _ in range(5)) * 1e9

    ops = json.loads(run([binary("bench_cpu_ops"), "--isa", "best", "--threads", "1", "--reps", "3", "--numel",
                          str(args.numel), "--ops", ",".join(MEM_OPS + ["attention_fwd_bwd"]), "--json"]))["rows"]
    mem = [r for r in ops if r["op"] in MEM_OPS]
    copy = statistics.median(r["copy_GB/s"] for r in mem) * 1e9
    elementwise = statistics.median(r["fraction_of_copy"] for r in mem)
    attention = [r for r in ops if r["op"] == "attention_fwd_bwd"][0]["GFLOP/s"] * 1e9 * 12 / 7 / peak

    links = {}
    for op in RING_AT_2:
        rows = json.loads(run(["mpirun", "-n", "2", "--oversubscribe", "--bind-to", "none",
                               binary("bench_collectives"), "--op", op, "--backend", "mpi", "--min-bytes", "1K",
                               "--max-bytes", "8M", "--step-factor", "2", "--iters", "20", "--warmup", "5",
                               "--json"]))["rows"]
        links[op] = fit_alpha_beta(rows, op)
    alpha, beta = links["all_reduce"]

    cores = os.cpu_count() or 1
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    machine = {
        "name": "cpu-host",
        "gpus_per_node": cores,
        "peak_flops_16": peak,
        "peak_flops_32": peak,
        "mem_bw": copy,
        "mem_capacity": mem_total / cores,
        "intra": {"alpha": alpha, "beta": beta},
        "inter": {"alpha": alpha, "beta": beta},
        "eff": {"gemm": 1.0, "attention": attention, "elementwise": elementwise},
        "collectives": {op: {"alpha": a, "beta": b} for op, (a, b) in links.items()},
        "cpu": True,
        "source": "scripts/predict_calibrate.py on {}, {} cores: sgemm {:.1f} GFLOP/s, copy {:.1f} GB/s, mpi "
                  "alpha/beta: {} (one host: inter = intra = all-reduce's)".format(
                      cpu_name(), cores, peak / 1e9, copy / 1e9,
                      ", ".join("{} {:.1f} us {:.2f} GB/s".format(op.replace("_", "-"), a * 1e6, b / 1e9)
                                for op, (a, b) in links.items())),
    }
    with open(args.out, "w") as f:
        json.dump(machine, f, indent=2)
        f.write("\n")
    print(json.dumps(machine, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()
