#!/usr/bin/env python3
"""Throughput with a straggler: tokens/s when one worker of four sleeps 0, 50 or 200 ms a step (train_gpt's
--inject-delay), for synchronous DDP, DDP with a backup worker (the synchronous parameter server, which is DDP's
arithmetic, taking each step's first 3 gradients: `--ps 1 --backup-workers 1`), local SGD (four replicas, a sync
every 8 steps) and an asynchronous parameter server (four workers and one server, `--ps 1 --ps-mode async`).

    bench/stragglers.py                      # delays 0, 50, 200 ms; 200 steps of a small GPT (about 2 minutes)
    bench/stragglers.py --delays 0,100 --steps 60 --json

What to expect: DDP runs at the slowest rank's pace (every step waits for its gradient); local SGD waits for it at
every outer sync, so it too runs at its pace, only in coarser steps; the asynchronous server takes steps · W
gradients from whoever pushes them, so the other three carry the run and throughput holds (the straggler's
gradients arrive stale instead); with a backup worker each step goes on without the last gradient, which is
dropped.

The table is tokens/s of the whole job (global batch · steps over the slowest worker's time) and each row's ratio to
its own undelayed run. The job ends when its slowest worker does, so an asynchronous run pays the straggler's last
step (sleep included) once: 200 steps make that a steady state's figure (at 40, 200 ms is a quarter of the run). Four workers on a small machine oversubscribe it (the sleeping rank frees a core for the
others): the provenance above the table names the CPU.
"""
import argparse
import json
import os
import re
import subprocess
import sys

import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = {
    "ddp": (4, []),
    "ddp-backup": (5, ["--ps", "1", "--backup-workers", "1"]),
    "local-sgd": (4, ["--replica-groups", "4", "--sync", "local-sgd", "--sync-every", "8"]),
    "async-ps": (5, ["--ps", "1", "--ps-mode", "async"]),
}


def run(args, mode, delay):
    ranks, extra = MODES[mode]
    cmd = ["mpirun", "-n", str(ranks), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", args.binary,
           "--threads", "1", "--steps", str(args.steps), "--eval-every", "0", "--eval-windows", "1", "--log-every",
           str(args.steps), "--seed", "1337", "--layers", "2", "--heads", "2", "--embd", "64", "--seq", "64",
           "--batch", "16"] + extra
    if delay > 0:
        cmd += ["--inject-delay", f"3:{delay}"]
    if args.data:
        cmd += ["--data", args.data]
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(r"^summary: .*tokens_per_s=([0-9.]+)", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        sys.exit(f"stragglers: `{' '.join(cmd)}` failed (exit {proc.returncode}):\n{proc.stdout[-2000:]}"
                 f"{proc.stderr[-2000:]}")
    pushes = re.search(r"per worker: ([0-9 ]+)\)", proc.stdout)
    return float(m.group(1)), pushes.group(1) if pushes else ""


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "train_gpt"), help="train_gpt to run")
    p.add_argument("--data", default="", help="--data for train_gpt (default: its own)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run (default 200)")
    p.add_argument("--delays", default="0,50,200", help="milliseconds rank 3 sleeps a step (default 0,50,200)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    args = p.parse_args()
    delays = [int(d) for d in args.delays.split(",")]
    prov = provenance.provenance()
    rows = []
    for mode in MODES:
        base = None
        for d in delays:
            tps, pushes = run(args, mode, d)
            base = tps if base is None else base
            rows.append({"mode": mode, "delay_ms": d, "tokens_per_s": tps, "vs_undelayed": tps / base,
                         "pushes_per_worker": pushes})
    if args.json:
        print(json.dumps({"provenance": prov, "rows": rows}, indent=2))
        return
    print(provenance.header(prov), end="")
    print(f"# one worker of four (rank 3) sleeps the delay at every step; {args.steps} steps, global batch 16")
    print(f"{'mode':<11} {'delay ms':>8} {'tokens/s':>10} {'vs 0 ms':>8}  gradients applied per worker")
    for r in rows:
        print(f"{r['mode']:<11} {r['delay_ms']:>8} {r['tokens_per_s']:>10.0f} {r['vs_undelayed']:>8.2f}  "
              f"{r['pushes_per_worker']}")


if __name__ == "__main__":
    main()
