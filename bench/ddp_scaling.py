#!/usr/bin/env python3
"""Weak scaling of train_gpt under data parallelism: the same per-rank batch at 1, 2, 4 ... ranks (one thread each),
so the global batch grows with the ranks and, ideally, so does throughput.

    bench/ddp_scaling.py                            # baby config, 1,2,4 ranks, mpi backend
    bench/ddp_scaling.py --ranks 1,2 --backend ring --steps 60 --json

For each rank count N it runs `mpirun -n N build/bin/train_gpt --threads 1 --batch N*B ...`, reads the `summary:`
line and prints ms/step, tokens/s (global), efficiency = tokens/s(N) / (N * tokens/s(1)), and the per-step
breakdown reported by rank 0: compute (step time minus exposed communication), communication (the DDP
communication thread's all-reduce time, mostly overlapped with backward) and exposed communication (time
backward's end waited for buckets). More ranks than cores oversubscribe the machine: such rows are marked and
their efficiency says more about the machine than about minidl.

With --machine-baseline it also runs N independent one-rank jobs at once (no MPI, no communication) for each N:
their combined tokens/s over N times one job alone is what the machine itself allows N busy cores ('machine':
shared caches and memory bandwidth, clock boost, a hypervisor's neighbours), and DDP's efficiency divided by it
('vs mach.') is the part minidl is responsible for.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "baby": dict(layers=4, heads=4, embd=128, seq=64, batch=12),
    "nanogpt": dict(layers=6, heads=6, embd=384, seq=256, batch=8),
}


def run(n, args, cfg):
    cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
           args.binary, "--threads", "1", "--steps", str(args.steps), "--eval-every", "0", "--eval-windows", "1",
           "--log-every", str(args.steps), "--backend", args.backend, "--seed", "1337",
           "--layers", str(cfg["layers"]), "--heads", str(cfg["heads"]), "--embd", str(cfg["embd"]),
           "--seq", str(cfg["seq"]), "--batch", str(cfg["batch"] * n)]
    if args.data:
        cmd += ["--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(r"^summary: (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        sys.exit(f"ddp_scaling: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def run_independent(n, args, cfg):
    """n one-rank jobs at once, no communication: what the machine itself allows n busy cores (shared caches, memory
    bandwidth, clock boost). Returns the jobs' combined tokens/s."""
    cmd = [args.binary, "--threads", "1", "--steps", str(args.steps), "--eval-every", "0", "--eval-windows", "1",
           "--log-every", str(args.steps), "--seed", "1337", "--layers", str(cfg["layers"]), "--heads",
           str(cfg["heads"]), "--embd", str(cfg["embd"]), "--seq", str(cfg["seq"]), "--batch", str(cfg["batch"])]
    if args.data:
        cmd += ["--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    total = 0.0
    for proc in procs:
        out, err = proc.communicate()
        m = re.search(r"^summary: (.*)$", out, re.M)
        if proc.returncode != 0 or not m:
            sys.exit(f"ddp_scaling: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{out[-2000:]}{err[-2000:]}")
        total += float(dict(kv.split("=") for kv in m.group(1).split())["tokens_per_s"])
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="baby", help="model and per-rank batch")
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts (the first is the baseline)")
    p.add_argument("--backend", choices=["mpi", "ring"], default="mpi", help="DDP's all-reduce")
    p.add_argument("--steps", type=int, default=50, help="training steps per run (the first is not timed)")
    p.add_argument("--data", help="text file (default: train_gpt's default corpus)")
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "train_gpt"), help="train_gpt to run")
    p.add_argument("--json", action="store_true", help="print the rows as JSON as well")
    p.add_argument("--machine-baseline", action="store_true",
                   help="also run N independent one-rank jobs at once for each N: the machine's own weak-scaling "
                        "ceiling (column 'machine'), and DDP's efficiency relative to it (column 'vs mach.')")
    args = p.parse_args()
    if not os.path.exists(args.binary):
        sys.exit(f"ddp_scaling: {args.binary} does not exist; build first (scripts/build.sh)")
    ranks = [int(r) for r in args.ranks.split(",")]
    cfg = CONFIGS[args.config]
    cores = os.cpu_count() or 1
    rows = []
    for n in ranks:
        s = run(n, args, cfg)
        rows.append(dict(ranks=n, global_batch=cfg["batch"] * n, ms_per_step=s["ms_per_step"],
                         tokens_per_s=s["tokens_per_s"], compute_ms=s["compute_ms"], comm_ms=s["comm_ms"],
                         exposed_comm_ms=s["exposed_comm_ms"], oversubscribed=n > cores))
        if args.machine_baseline:
            rows[-1]["independent_tokens_per_s"] = run_independent(n, args, cfg)
    base = rows[0]["tokens_per_s"] / rows[0]["ranks"]
    prov = provenance.provenance()
    print(provenance.header(prov), end="")
    print(f"# weak scaling, {args.config} config ({cfg['batch']} sequences per rank), backend {args.backend}, "
          f"1 thread per rank, {args.steps} steps, {cores} cores")
    print(f"{'ranks':>5} {'batch':>6} {'ms/step':>9} {'tokens/s':>9} {'effic.':>7} {'compute':>8} {'comm':>8} "
          f"{'exposed':>8} {'exp.%':>6}" + (f" {'machine':>8} {'vs mach.':>8}" if args.machine_baseline else ""))
    for r in rows:
        r["efficiency"] = r["tokens_per_s"] / (r["ranks"] * base)
        r["exposed_pct"] = 100 * r["exposed_comm_ms"] / r["ms_per_step"] if r["ms_per_step"] else 0
        mark = "  (oversubscribed)" if r["oversubscribed"] else ""
        machine = ""
        if args.machine_baseline:
            r["machine_efficiency"] = r["independent_tokens_per_s"] / (r["ranks"] * rows[0]["independent_tokens_per_s"])
            r["efficiency_vs_machine"] = r["efficiency"] / r["machine_efficiency"]
            machine = f" {100 * r['machine_efficiency']:>7.1f}% {100 * r['efficiency_vs_machine']:>7.1f}%"
        print(f"{r['ranks']:>5} {r['global_batch']:>6} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>9.0f} "
              f"{100 * r['efficiency']:>6.1f}% {r['compute_ms']:>8.2f} {r['comm_ms']:>8.2f} "
              f"{r['exposed_comm_ms']:>8.2f} {r['exposed_pct']:>5.1f}%{machine}{mark}")
    if args.json:
        print(json.dumps({"provenance": prov, "rows": rows}))


if __name__ == "__main__":
    main()
