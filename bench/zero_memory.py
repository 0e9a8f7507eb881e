#!/usr/bin/env python3
"""ZeRO memory per rank, measured by the ledger against the prediction, for stages 0-3 at dp 1, 2 and 4.

Runs build/bin/train_gpt for one step per (stage, dp) under mpirun with --memory-report, which makes every rank
print its memory by tag after the first step beside train/zero_memory.h's prediction, and tabulates those lines:

    /usr/bin/python3 bench/zero_memory.py                       # the default model (4 layers, 128 wide, T 64)
    /usr/bin/python3 bench/zero_memory.py --layers 6 --embd 384 --seq 256 --batch 8 --json
    /usr/bin/python3 bench/zero_memory.py --amp bf16 --recompute block --dps 2,4

Columns: stage, dp, rank, then measured / predicted MiB of parameters, gradients and optimizer state held
between steps (dist/zero.h, dist/zero3.h: 4Ψ | 4Ψ/N | 8Ψ/N ...), and the activation peak against its estimate.
Ranks beyond the cores are oversubscribed (the memory does not depend on speed).
"""
import argparse
import json
import os
import re
import subprocess
import sys

import provenance

LINE = re.compile(
    r"zero-(\d) memory, dp rank (\d+) of (\d+): params=([\d.]+) grads=([\d.]+) optimizer=([\d.]+) "
    r"activations=([\d.]+) comm=([\d.]+) MiB; predicted params=([\d.]+) grads=([\d.]+) optimizer=([\d.]+) "
    r"activations=([\d.]+) MiB")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train-gpt", default=os.path.join(root, "build", "bin", "train_gpt"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="global batch (a multiple of every dp)")
    ap.add_argument("--amp", default="off")
    ap.add_argument("--recompute", default="none")
    ap.add_argument("--stages", default="0,1,2,3")
    ap.add_argument("--dps", default="1,2,4")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not os.path.exists(a.train_gpt):
        sys.exit(f"zero_memory: {a.train_gpt} not found: build it first (scripts/build.sh)")
    rows = []
    for dp in [int(x) for x in a.dps.split(",")]:
        for stage in [int(x) for x in a.stages.split(",")]:
            cmd = ["mpirun", "-n", str(dp), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none",
                   a.train_gpt, "--zero", str(stage), "--memory-report",
                   "--steps", "1", "--threads", "1", "--layers", str(a.layers), "--heads", str(a.heads),
                   "--embd", str(a.embd), "--seq", str(a.seq), "--batch", str(a.batch), "--amp", a.amp,
                   "--recompute", a.recompute, "--eval-windows", "1", "--progress", "lines", "--backend", "ring"]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"zero_memory: {' '.join(cmd)} failed:\n{out.stdout}{out.stderr}")
            for m in LINE.finditer(out.stdout):
                v = [float(x) for x in m.groups()[3:]]
                rows.append({"stage": int(m.group(1)), "dp": int(m.group(3)), "rank": int(m.group(2)),
                             "params_mib": v[0], "grads_mib": v[1], "optimizer_mib": v[2], "activations_mib": v[3],
                             "comm_mib": v[4], "pred_params_mib": v[5], "pred_grads_mib": v[6],
                             "pred_optimizer_mib": v[7], "pred_activations_mib": v[8]})
    rows.sort(key=lambda r: (r["dp"], r["stage"], r["rank"]))
    if a.json:
        print(json.dumps({"provenance": provenance.provenance(), "config": vars(a), "rows": rows}, indent=1))
        return
    print(provenance.header(provenance.provenance()), end="")
    print(f"# layers {a.layers}, embd {a.embd}, seq {a.seq}, batch {a.batch}, amp {a.amp}, recompute {a.recompute}:"
          " MiB per rank, measured / predicted")
    print(f"{'stage':>5} {'dp':>3} {'rank':>4} {'params':>15} {'grads':>15} {'optimizer':>15} {'activations':>15}")
    for r in rows:
        cell = lambda k: f"{r[k + '_mib']:.3f}/{r['pred_' + k + '_mib']:.3f}"
        print(f"{r['stage']:>5} {r['dp']:>3} {r['rank']:>4} {cell('params'):>15} {cell('grads'):>15} "
              f"{cell('optimizer'):>15} {cell('activations'):>15}")


if __name__ == "__main__":
    main()
