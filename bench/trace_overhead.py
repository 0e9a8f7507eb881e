#!/usr/bin/env python3
"""What --trace costs a training step: train_gpt with tracing off and on, in turns, medians of ms/step.

    bench/trace_overhead.py [--bin build/bin] [--rounds 6] [--steps 30] [--ranks 1] [--json] [-- train_gpt flags]

Each round runs the same command twice, once without and once with --trace (into a temporary folder), in an order
that alternates from round to round, so a machine whose speed drifts slows both alike; ms/step is the summary's
(the steps after the first). The cost is on/off, as the ratio of the medians and as the median of each round's own
ratio (its two runs were neighbours in time); the spread of the rounds says how much of it is noise.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ms_per_step(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    m = re.search(r"summary: .*ms_per_step=([0-9.]+)", out.stdout)
    if out.returncode != 0 or not m:
        sys.exit(f"trace_overhead: {' '.join(cmd)} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return float(m.group(1))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--ranks", type=int, default=1, help="mpirun -n this many (1: a plain process)")
    p.add_argument("--json", action="store_true")
    p.add_argument("flags", nargs="*", help="more train_gpt flags (after --)")
    args = p.parse_args()
    launcher = [] if args.ranks == 1 else ["mpirun", "-n", str(args.ranks), "--oversubscribe", "--bind-to", "none"]
    base = launcher + [os.path.join(args.bin, "train_gpt"), "--steps", str(args.steps), "--eval-windows", "4",
                       "--log-every", "100000"] + args.flags
    off, on = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for traced in ([False, True] if r % 2 == 0 else [True, False]):
                cmd = base + (["--trace", os.path.join(tmp, f"round{r}")] if traced else [])
                (on if traced else off).append(ms_per_step(cmd))
    m_off, m_on = statistics.median(off), statistics.median(on)
    paired = statistics.median(b / a for a, b in zip(off, on))
    prov = provenance.provenance()
    row = {"ranks": args.ranks, "steps": args.steps, "flags": " ".join(args.flags), "off_ms": off, "on_ms": on,
           "median_off_ms": m_off, "median_on_ms": m_on, "on_over_off": m_on / m_off,
           "median_round_on_over_off": paired}
    if args.json:
        print(json.dumps({"provenance": prov, "rows": [row]}))
        return 0
    print(provenance.header(prov), end="")
    print(f"# train_gpt {' '.join(args.flags) or '(baby config)'}, {args.ranks} rank(s), {args.steps} steps, "
          f"{args.rounds} rounds in turns")
    print(f"{'trace':<6} {'median ms/step':>15}  rounds")
    print(f"{'off':<6} {m_off:>15.2f}  " + " ".join(f"{x:.2f}" for x in off))
    print(f"{'on':<6} {m_on:>15.2f}  " + " ".join(f"{x:.2f}" for x in on))
    print(f"on/off {m_on / m_off:>15.3f}  (medians); {paired:.3f} (median of the rounds' own ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
