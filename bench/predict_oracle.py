#!/usr/bin/env python3
"""minidl_predict against measurements on this host: bench_gpt_step's baby config (layers 4, heads 4, embd 128,
seq 64, batch 12 per data-parallel rank, vocab 65) at one rank and at two (dp, ZeRO, tp, pp; and, timed by
train_gpt, local SGD, DiLoCo, the parameter server's sync and async modes, context parallelism and the baby Llama
as a mixture of 4 experts, top 2, at one rank, dp 2 and dp 2 with ep 2), one thread per rank,
beside the prediction for the calibrated cpu-host machine (scripts/predict_calibrate.py). The calibration measures
the sgemm ceiling at the baby config's shapes, so two larger configs at one rank (embd 256, and nanoGPT's 6 x 384
at seq 256) check the products' time out of that sample.

    bench/predict_oracle.py                       # build/bin, 3 runs of each in turns
    bench/predict_oracle.py --bin build42/bin --reps 5 --json
    bench/predict_oracle.py --oversubscribed      # 4-rank layouts on this host's cores, reported apart

With --oversubscribed it runs 4-rank layouts instead: on a 2-core host two ranks share each core, which the
prediction (a core per rank) does not model, so these rows are reported apart from the accuracy table.

Each row's runs alternate with the other rows' (so a busy minute hits all of them), and the table gives the
median and the fastest run, and the prediction's error against each.

The host's speed drifts (on a shared VM the same step took 38 and 56 ms minutes apart), so one calibration before
the runs speaks of its minute, not of theirs. Each round therefore begins with a calibration of its own
(scripts/predict_calibrate.py, about half a minute: the sgemm ceiling's median of 5, the copy bandwidth, each
collective's α and β), and the round's runs are predicted from it; the per-run predictions' median is compared
with the runs' median, and the spread of both and of the rounds' ceilings is printed. --fixed predicts every run
from one machine file instead (--machine-file, by default predict/presets/cpu-host.json), to show what the drift
did. On a shared machine the fastest run is the
closest to the machine's own speed (the noise only adds). The ranking check compares the two-rank layouts pairwise
by their fastest runs: every pair measured more than 5% apart must keep its order in the prediction (closer pairs
are within the noise of these runs). The host's load average is printed
before and after: two ranks on a two-core host that something else is using measure that too.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import provenance

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, ranks, bench_gpt_step flags, minidl_predict flags); the baby config unless the flags say otherwise.
MEDIUM = ["--layers", 4, "--heads", 4, "--embd", 256, "--seq", 128, "--batch", 8]
NANOGPT = ["--layers", 6, "--heads", 6, "--embd", 384, "--seq", 256, "--batch", 8]
ROWS = [
    ("1 rank, L4 C256 T128 B8", 1, MEDIUM, MEDIUM),
    ("1 rank, L6 C384 T256 B8", 1, NANOGPT + ["--steps", 5], NANOGPT),
    ("1 rank", 1, [], ["--batch", 12]),
    ("1 rank, recompute block", 1, ["--recompute", "block"], ["--batch", 12, "--recompute", "block"]),
    ("dp 2 (DDP)", 2, [], ["--dp", 2, "--batch", 24]),
    ("dp 2, ZeRO-1", 2, ["--zero", 1], ["--dp", 2, "--batch", 24, "--zero", 1]),
    ("dp 2, ZeRO-2", 2, ["--zero", 2], ["--dp", 2, "--batch", 24, "--zero", 2]),
    ("dp 2, ZeRO-3", 2, ["--zero", 3], ["--dp", 2, "--batch", 24, "--zero", 3]),
    ("dp 2, recompute block", 2, ["--recompute", "block"], ["--dp", 2, "--batch", 24, "--recompute", "block"]),
    ("tp 2", 2, ["--tp", 2], ["--tp", 2, "--batch", 12]),
    ("tp 2, sequence parallel", 2, ["--tp", 2, "--sequence-parallel"], ["--tp", 2, "--batch", 12,
                                                                         "--sequence-parallel"]),
    ("tp 2, recompute block", 2, ["--tp", 2, "--recompute", "block"], ["--tp", 2, "--batch", 12, "--recompute",
                                                                        "block"]),
    ("1 rank, Llama", 1, ["--model", "llama"], ["--model", "llama", "--batch", 12]),
] + [(f"pp 2, {name}, M {m}", 2, ["--pp", 2, "--micro-batches", m, "--schedule", kind] + extra,
      ["--pp", 2, "--micro-batches", m, "--batch", 12, "--schedule", kind] + extra)
     for name, kind, extra, ms in (("GPipe", "gpipe", [], (1, 4)), ("1F1B", "1f1b", [], (1, 4)),
                                   ("interleaved V 2", "interleaved", ["--virtual-stages", 2], (2, 4)))
     for m in ms]
# Measured by train_gpt (its summary's ms_per_step: bench_gpt_step has no outer sync and no parameter server), 40
# steps (five outer syncs at H 8), the first step left out as everywhere. Their
# flags: (name, ranks, train_gpt flags, minidl_predict flags).
TRAINER = "trainer"
MOE = ["--model", "llama", "--moe-experts", 4, "--moe-top-k", 2]  # the baby Llama, every block MoE
TRAINER_ROWS = [
    ("local SGD, R 2, H 8", 2, ["--batch", 24, "--sync", "local-sgd", "--replica-groups", 2, "--sync-every", 8],
     ["--batch", 24, "--sync", "local-sgd", "--replica-groups", 2, "--sync-every", 8]),
    ("DiLoCo, R 2, H 8", 2, ["--batch", 24, "--sync", "diloco", "--replica-groups", 2, "--sync-every", 8],
     ["--batch", 24, "--sync", "diloco", "--replica-groups", 2, "--sync-every", 8]),
    ("parameter server, sync", 2, ["--batch", 12, "--ps", 1], ["--batch", 12, "--ps", 1]),
    ("parameter server, async", 2, ["--batch", 12, "--ps", 1, "--ps-mode", "async"],
     ["--batch", 12, "--ps", 1, "--ps-mode", "async"]),
    ("cp 2 (ring attention)", 2, ["--batch", 12, "--cp", 2], ["--batch", 12, "--cp", 2]),
] + [(name, ranks, MOE + flags, MOE + flags + ["--dp", ranks]) for name, ranks, flags in (
    ("1 rank, Llama MoE E 4 k 2", 1, ["--batch", 12]),
    ("dp 2, Llama MoE E 4 k 2", 2, ["--batch", 24]),
    ("dp 2, ep 2, Llama MoE E 4 k 2", 2, ["--batch", 24, "--ep", 2]))]
ROWS = ROWS + [(name, ranks, [TRAINER] + flags, pflags) for name, ranks, flags, pflags in TRAINER_ROWS]
# Four ranks: on a host of fewer cores, oversubscribed.
OVERSUBSCRIBED = [
    ("dp 4 (DDP)", 4, [], ["--dp", 4, "--batch", 48]),
    ("dp 2 x tp 2", 4, ["--tp", 2], ["--dp", 2, "--tp", 2, "--batch", 24]),
    ("tp 4", 4, ["--tp", 4], ["--tp", 4, "--batch", 12]),
    ("pp 4, 1F1B, M 4", 4, ["--pp", 4, "--micro-batches", 4], ["--pp", 4, "--micro-batches", 4, "--batch", 12]),
]


def run(cmd):
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    out = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", env=env)
    if out.returncode != 0:
        sys.exit(f"predict_oracle: {' '.join(map(str, cmd))} failed:\n{out.stderr}")
    summary = re.search(r"^summary: .*ms_per_step=([0-9.]+)", out.stdout, re.M)
    if summary:  # train_gpt
        return {"ms_per_step": float(summary.group(1))}
    return json.loads(out.stdout.strip().splitlines()[-1])


def ranking_check(rows, apart=0.05):
    """The pairs of rows measured more than `apart` apart (fastest runs), and those the prediction orders the other way."""
    pairs, swapped = 0, []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            lo, hi = sorted((a, b), key=lambda r: r["fastest_ms"])
            if hi["fastest_ms"] <= lo["fastest_ms"] * (1 + apart):
                continue
            pairs += 1
            if lo["predicted_ms"] >= hi["predicted_ms"]:
                swapped.append(f"{lo['row']} < {hi['row']}")
    return {"pairs": pairs, "swapped": swapped}


def calibrate(bin_dir, path):
    """A calibration of the host now (scripts/predict_calibrate.py), written to path; returns the machine."""
    out = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "predict_calibrate.py"), "--bin", bin_dir,
                          "--out", path], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"predict_oracle: the calibration failed:\n{out.stderr}")
    return json.load(open(path))


def load():
    return open("/proc/loadavg").read().split()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--oversubscribed", action="store_true", help="the 4-rank layouts instead")
    ap.add_argument("--fixed", action="store_true",
                    help="predict every run from --machine-file instead of calibrating in every round")
    ap.add_argument("--machine-file", default=os.path.join(ROOT, "predict", "presets", "cpu-host.json"),
                    help="with --fixed: the calibrated host (scripts/predict_calibrate.py writes it)")
    args = ap.parse_args()
    scratch = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"predict_oracle_{os.getpid()}.json")
    table = OVERSUBSCRIBED if args.oversubscribed else ROWS
    bench, predict = os.path.join(args.bin, "bench_gpt_step"), os.path.join(args.bin, "minidl_predict")
    trainer = os.path.join(args.bin, "train_gpt")
    load_before = load()
    measured = {name: [] for name, *_ in table}
    predicted = {name: [] for name, *_ in table}
    ceilings = []  # each round's calibrated sgemm ceiling, GFLOP/s
    for _ in range(args.reps):
        machine_file = args.machine_file if args.fixed else scratch
        if not args.fixed:
            calibrate(args.bin, scratch)
        ceilings.append(json.load(open(machine_file))["peak_flops_32"] / 1e9)
        for name, ranks, flags, pflags in table:
            steps = [] if "--steps" in flags else ["--steps", args.steps]
            if flags and flags[0] == TRAINER:
                cmd = [trainer, "--threads", 1, "--steps", 40, "--eval-every", 0, "--eval-windows", 1,
                       "--log-every", 40] + flags[1:]
            else:
                cmd = [bench, "--threads", 1, "--warmup", 3, "--json"] + steps + flags
            if ranks > 1:
                cmd = ["mpirun", "-n", ranks, "--oversubscribe", "--bind-to", "none"] + cmd
            measured[name].append(run(cmd)["ms_per_step"])
            predicted[name].append(run([predict, "--machine-file", machine_file, "--json"] + pflags)["step_ms"])
    if os.path.exists(scratch):
        os.remove(scratch)
    rows = []
    for name, ranks, _, _ in table:
        median, fastest = statistics.median(measured[name]), min(measured[name])
        pred = statistics.median(predicted[name])
        fastest_pred = predicted[name][measured[name].index(fastest)]  # the fastest run's own prediction
        spread = lambda v: (max(v) - min(v)) / statistics.median(v)
        rows.append({"row": name, "ranks": ranks, "measured_ms": measured[name], "predicted_runs_ms": predicted[name],
                     "median_ms": median, "fastest_ms": fastest,
                     "predicted_ms": pred, "error": (pred - median) / median,
                     "error_fastest": (fastest_pred - fastest) / fastest, "measured_spread": spread(measured[name]),
                     "predicted_spread": spread(predicted[name])})
    ranking = ranking_check([r for r in rows if r["ranks"] == 2])
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(l.split(":", 1) for l in cpu.splitlines() if ":" in l)
    name = "{} family {} model {}, {} CPUs".format(*(fields.get(k, "?").strip() for k in
                                                    ("Model name", "CPU family", "Model", "CPU(s)")))
    if args.json:
        print(json.dumps({"provenance": provenance.provenance(), "cpu": name, "load_before": load_before,
                          "ceilings_gflops": ceilings, "fixed": args.fixed,
                          "load_after": load(), "rows": rows, "ranking": ranking}, indent=1))
        return
    print(provenance.header(provenance.provenance()), end="")
    print(f"# cpu: {name}; load average {load_before} before, {load()} after; {args.reps} runs each; "
          + ("predicted from " + args.machine_file if args.fixed else
             "each round calibrated before its runs, sgemm ceilings " +
             ", ".join(f"{c:.1f}" for c in ceilings) + " GFLOP/s"))
    print(f"{'configuration':28} {'median_ms':>9} {'spread':>6} {'predicted':>9} {'spread':>6} {'error':>6} "
          f"{'fastest':>8} {'its error':>9}")
    for r in rows:
        print(f"{r['row']:28} {r['median_ms']:9.2f} {100 * r['measured_spread']:5.0f}% {r['predicted_ms']:9.2f} "
              f"{100 * r['predicted_spread']:5.0f}% {100 * r['error']:+5.0f}% {r['fastest_ms']:8.2f} "
              f"{100 * r['error_fastest']:+8.0f}%")
    if ranking["pairs"]:
        print(f"# ranking: {ranking['pairs'] - len(ranking['swapped'])} of {ranking['pairs']} pairs of two-rank layouts "
              f"measured more than 5% apart keep their order" +
              (f"; swapped: {'; '.join(ranking['swapped'])}" if ranking["swapped"] else ""))


if __name__ == "__main__":
    main()
