#!/usr/bin/env python3
"""Strong scaling of train_gpt over (dp, tp, pp, zero, cp, schedule): the same global batch and model for every
configuration, so every row trains the same thing (the parallel modes are tested equal to one process) and only
the speed and the memory differ.

    bench/scaling.py                                   # baby: 1 rank, dp 2, pp 2 (three schedules), dp2 x pp2, cp 2
    bench/scaling.py --config nanogpt --steps 6 --sweep 1,1,1:1f1b:4 1,1,2:gpipe:4 1,1,2:1f1b:4 \\
                     1,1,2:interleaved:4:2 1,1,4:1f1b:8 1,1,4:interleaved:8:2 --json --plot scaling.png

A sweep entry is dp,tp,pp[,zero[,cp]]:schedule:micro_batches[:virtual_stages] (cp: context parallelism, each
sequence over cp ranks: --seq must be a multiple of 2 cp); the single-rank baseline accumulates over
the same micro-batches (--grad-accum M), so efficiency = tokens/s(N) / (N x tokens/s(1)) compares equal work. For
each row: ms/step, tokens/s, efficiency, the schedule's bubble as simulated by dist/pipeline (unit costs; what an
ideal machine would idle) beside the measured one (each stage's time blocked on a peer over its schedule time, the
mean over stages) and the measured loss of efficiency, exposed communication (rank 0's), and the memory
ledger's peaks (activations per pipeline stage; parameters, gradients and optimizer state of rank 0). More ranks
than cores oversubscribe the machine: such rows are marked, and their efficiency says more about the machine than
about minidl. --plot writes a PNG (efficiency and step-time breakdown) when matplotlib is installed
(scripts/install-deps.sh --with-plot: Debian's python3-matplotlib, used through /usr/bin/python3 if need be).
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
    "baby": dict(layers=4, heads=4, embd=128, seq=64, batch=8),
    "nanogpt": dict(layers=6, heads=6, embd=384, seq=256, batch=8),
}
DEFAULT_SWEEP = ["1,1,1:1f1b:4", "2,1,1:1f1b:2", "1,1,2:gpipe:4", "1,1,2:1f1b:4", "1,1,2:interleaved:4:2",
                 "2,1,2:1f1b:2", "1,1,1,0,2:1f1b:4"]


def parse_entry(text):
    parts = text.split(":")
    grid = [int(x) for x in parts[0].split(",")]
    if len(grid) not in (3, 4, 5) or len(parts) not in (3, 4):
        sys.exit(f"scaling: expected dp,tp,pp[,zero[,cp]]:schedule:micro_batches[:virtual_stages], got '{text}'")
    dp, tp, pp = grid[:3]
    return dict(dp=dp, tp=tp, pp=pp, zero=grid[3] if len(grid) >= 4 else 0, cp=grid[4] if len(grid) == 5 else 1,
                schedule=parts[1],
                micro_batches=int(parts[2]), virtual_stages=int(parts[3]) if len(parts) == 4 else 1)


def run(e, args, cfg):
    n = e["dp"] * e["tp"] * e["pp"] * e["cp"]
    cmd = ["mpirun", "-n", str(n), "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", args.binary,
           "--threads", "1", "--steps", str(args.steps), "--eval-every", "0", "--eval-windows", "1",
           "--log-every", str(args.steps), "--seed", "1337", "--batch", str(cfg["batch"]),
           "--layers", str(cfg["layers"]), "--heads", str(cfg["heads"]), "--embd", str(cfg["embd"]),
           "--seq", str(cfg["seq"]), "--dp", str(e["dp"]), "--tp", str(e["tp"]), "--pp", str(e["pp"]),
           "--zero", str(e["zero"]), "--cp", str(e["cp"])]
    if e["pp"] > 1:
        cmd += ["--micro-batches", str(e["micro_batches"]), "--schedule", e["schedule"],
                "--virtual-stages", str(e["virtual_stages"])]
    else:
        # The same micro-batches as the pipeline rows: dp ranks x grad_accum = M micro-batches in all.
        cmd += ["--grad-accum", str(max(1, e["micro_batches"] // e["dp"]))]
    if args.data:
        cmd += ["--data", args.data]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    m = re.search(r"^summary: (.*)$", proc.stdout, re.M)
    if proc.returncode != 0 or not m:
        err = (proc.stdout + proc.stderr).strip().splitlines()
        why = next((l for l in err if "error" in l), err[-1] if err else "no output")
        return dict(error=why.strip())
    s = {k: float(v) for k, v in (kv.split("=") for kv in m.group(1).split())}
    b = re.search(r"simulated bubble ([0-9.]+)%", proc.stdout)
    a = re.search(r"^pipeline activation peak per stage \(MiB\): (.*)$", proc.stdout, re.M)
    w = re.search(r"^pipeline measured bubble per stage \(%\):.*; mean ([0-9.]+)%", proc.stdout, re.M)
    s["bubble_sim_pct"] = float(b.group(1)) if b else 0.0
    s["bubble_measured_pct"] = float(w.group(1)) if w else 0.0
    s["act_per_stage_mb"] = [float(x) for x in a.group(1).split()] if a else [s["act_peak_mb"]]
    return s


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        # Debian's python3-matplotlib serves /usr/bin/python3, which may not be the python3 first on PATH.
        system = "/usr/bin/python3"
        if os.path.exists(system) and os.path.realpath(sys.executable) != os.path.realpath(system):
            done = subprocess.run([system, __file__, "--plot-rows", path], input=json.dumps(rows), text=True)
            if done.returncode == 0:
                return
        print(f"# --plot {path}: matplotlib is not installed (scripts/install-deps.sh --with-plot); no plot written")
        return
    ok = [r for r in rows if "error" not in r]
    names = [r["name"] for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.bar(names, [100 * r["efficiency"] for r in ok], color="tab:blue", label="measured")
    a.plot(names, [100 - r["bubble_sim_pct"] for r in ok], "k_", markersize=30, label="100% - simulated bubble")
    a.plot(names, [100 - r["bubble_measured_pct"] for r in ok], "r_", markersize=30, label="100% - measured bubble")
    a.set_ylabel("efficiency vs 1 rank (%)")
    a.legend()
    compute = [r["ms_per_step"] - r["exposed_comm_ms"] for r in ok]
    b.bar(names, compute, label="compute + pipeline waits", color="tab:green")
    b.bar(names, [r["exposed_comm_ms"] for r in ok], bottom=compute, label="exposed communication", color="tab:red")
    b.set_ylabel("ms per step")
    b.legend()
    for ax in (a, b):
        ax.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"# wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(CONFIGS), default="baby", help="model and global batch")
    p.add_argument("--sweep", nargs="+", default=DEFAULT_SWEEP,
                   help="entries dp,tp,pp[,zero]:schedule:M[:V]; the first is the baseline (1 rank)")
    p.add_argument("--steps", type=int, default=10, help="training steps per run (the first is not timed)")
    p.add_argument("--data", help="text file (default: train_gpt's default corpus)")
    p.add_argument("--binary", default=os.path.join(ROOT, "build", "bin", "train_gpt"), help="train_gpt to run")
    p.add_argument("--json", action="store_true", help="print the rows as JSON as well")
    p.add_argument("--plot", help="write a PNG of efficiency and the step-time breakdown (needs matplotlib)")
    p.add_argument("--plot-rows", help=argparse.SUPPRESS)  # internal: plot the JSON rows on stdin to this path
    args = p.parse_args()
    if args.plot_rows:
        plot(json.load(sys.stdin), args.plot_rows)
        return
    if not os.path.exists(args.binary):
        sys.exit(f"scaling: {args.binary} does not exist; build first (scripts/build.sh)")
    cfg = CONFIGS[args.config]
    cores = os.cpu_count() or 1
    rows = []
    for text in args.sweep:
        e = parse_entry(text)
        e["ranks"] = e["dp"] * e["tp"] * e["pp"] * e["cp"]
        e["name"] = f"dp{e['dp']} tp{e['tp']} pp{e['pp']} z{e['zero']}" + (f" cp{e['cp']}" if e["cp"] > 1 else "") + \
            (f" {e['schedule']} M{e['micro_batches']}" + (f" V{e['virtual_stages']}" if e["virtual_stages"] > 1 else "")
             if e["pp"] > 1 else f" M{e['micro_batches']}")
        e.update(run(e, args, cfg))
        e["oversubscribed"] = e["ranks"] > cores
        rows.append(e)
    base = rows[0]
    prov = provenance.provenance()
    print(provenance.header(prov), end="")
    print(f"# strong scaling, {args.config} config (global batch {cfg['batch']}, layers {cfg['layers']}, "
          f"embd {cfg['embd']}, seq {cfg['seq']}), 1 thread per rank, {args.steps} steps, {cores} cores")
    print(f"{'configuration':<34} {'ranks':>5} {'ms/step':>9} {'tokens/s':>9} {'effic.':>7} {'bubble':>7} {'meas.':>6} "
          f"{'exposed':>8} {'act MiB per stage':<24} {'param':>6} {'grad':>6} {'optim':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['name']:<34} {r['ranks']:>5}  refused: {r['error']}")
            continue
        one = base.get("tokens_per_s", 0)
        r["efficiency"] = r["tokens_per_s"] / (r["ranks"] * one) if one else 0.0
        acts = " ".join(f"{x:.2f}" for x in r["act_per_stage_mb"])
        mark = "  (oversubscribed)" if r["oversubscribed"] else ""
        print(f"{r['name']:<34} {r['ranks']:>5} {r['ms_per_step']:>9.2f} {r['tokens_per_s']:>9.0f} "
              f"{100 * r['efficiency']:>6.1f}% {r['bubble_sim_pct']:>6.1f}% {r['bubble_measured_pct']:>5.1f}% "
              f"{r['exposed_comm_ms']:>8.2f} "
              f"{acts:<24} {r['param_mb']:>6.2f} {r['grad_mb']:>6.2f} {r['optim_mb']:>6.2f}{mark}")
    print("# bubble: simulated idle fraction of the schedule (unit costs); meas.: the stages' mean time blocked on a "
          "peer over their schedule time (timed steps); effic. includes it, communication, and on an oversubscribed "
          "machine the ranks' competition for cores")
    if args.plot:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps({"provenance": prov, "rows": rows}))


if __name__ == "__main__":
    main()
