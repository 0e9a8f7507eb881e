#!/usr/bin/env python3
"""Plots of minidl runs as PNG (Debian's python3-matplotlib: scripts/install-deps.sh --with-plot).

    scripts/plot.py loss RUN_DIR [RUN_DIR ...] -o loss.png        # train_gpt --tensorboard DIRs: loss curves
    scripts/plot.py breakdown TRACE_DIR -o breakdown.png          # train_gpt --trace DIR: where a step's time goes
    scripts/plot.py scaling ROWS.json -o scaling.png              # bench/scaling.py --json rows: efficiency

loss: train/loss (lines) and val/loss (markers) against the step, one colour per run, read from the event files
with a reader of their own (TFRecord framing, the Event and Summary messages' scalar fields), so TensorBoard need
not be installed. breakdown: per rank, the mean time per step (the first step left out) in forwards and backwards,
the optimizer, waiting for DDP's buckets (exposed communication), waiting for pipeline peers (the bubble) and the
rest, from the trace's spans. scaling: bench/scaling.py's own plot of its rows.
"""
import argparse
import bisect
import glob
import json
import os
import struct
import sys


def varint(data, i):
    shift = value = 0
    while True:
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def fields(data):
    """(field number, wire type, value) of a serialized protobuf message, for the wire types events use."""
    i = 0
    while i < len(data):
        key, i = varint(data, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(data, i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        elif wire == 2:
            n, i = varint(data, i)
            value, i = data[i:i + n], i + n
        else:
            raise ValueError(f"unexpected wire type {wire}")
        yield number, wire, value


def scalars(directory):
    """{tag: [(step, value), ...]} of every event file in `directory`."""
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*tfevents*"))):
        data = open(path, "rb").read()
        i = 0
        while i + 12 <= len(data):
            (length,) = struct.unpack_from("<Q", data, i)
            record = data[i + 12:i + 12 + length]
            i += 12 + length + 4
            step = 0
            for number, _, value in fields(record):
                if number == 2:
                    step = value
                elif number == 5:  # Summary
                    for n, _, v in fields(value):
                        if n != 1:
                            continue
                        tag, simple = None, None
                        for vn, vw, vv in fields(v):
                            if vn == 1:
                                tag = vv.decode()
                            elif vn == 2 and vw == 5:
                                (simple,) = struct.unpack("<f", vv)
                        if tag is not None and simple is not None:
                            out.setdefault(tag, []).append((step, simple))
    return out


def pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        sys.exit("plot: matplotlib is not installed (scripts/install-deps.sh --with-plot)")


def plot_loss(runs, output):
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, run in enumerate(runs):
        s = scalars(run)
        if "train/loss" not in s:
            sys.exit(f"plot: {run} has no train/loss events (train_gpt --tensorboard {run})")
        colour = f"C{k}"
        name = os.path.basename(os.path.normpath(run))
        ax.plot(*zip(*s["train/loss"]), color=colour, label=f"{name} train")
        if "val/loss" in s:
            ax.plot(*zip(*s["val/loss"]), "o", color=colour, label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def breakdown(trace_dir):
    """Per rank: {category: mean ms per step} from a --trace directory."""
    out = {}
    for path in sorted(glob.glob(os.path.join(trace_dir, "rank*.json"))):
        events = json.load(open(path))["traceEvents"]
        spans = [e for e in events if e.get("ph") == "X"]
        steps = [e for e in spans if e["name"].startswith("step ")]
        if len(steps) < 2:
            continue
        first_end = steps[0]["ts"] + steps[0]["dur"]
        later = [e for e in spans if e["ts"] >= first_end]
        n = len(steps) - 1
        total = sum(e["dur"] for e in steps[1:]) / n / 1e3

        def mean(pred):
            return sum(e["dur"] for e in later if pred(e["name"])) / n / 1e3

        # Waits happen inside forwards and backwards (a received activation, the last backward's buckets): count
        # them as waits, not as compute.
        compute = sorted((e["ts"], e["ts"] + e["dur"]) for e in later if e["name"].startswith(("forward", "backward")))
        starts = [a for a, _ in compute]

        def inside(e):
            k = bisect.bisect_right(starts, e["ts"]) - 1
            return k >= 0 and e["ts"] + e["dur"] <= compute[k][1] + 1e-3

        nested = sum(e["dur"] for e in later if e["name"] in ("wait for peer", "wait for buckets") and inside(e))
        row = {"forward and backward": mean(lambda x: x.startswith(("forward", "backward"))) - nested / n / 1e3,
               "optimizer": mean(lambda x: x == "optimizer"),
               "exposed communication": mean(lambda x: x == "wait for buckets"),
               "pipeline bubble": mean(lambda x: x == "wait for peer"),
               "data": mean(lambda x: x == "data")}
        row["other"] = max(0.0, total - sum(row.values()))
        out[int(events[0].get("pid", len(out)))] = row
    return out


def plot_breakdown(trace_dir, output):
    rows = breakdown(trace_dir)
    if not rows:
        sys.exit(f"plot: no rank*.json with two or more steps in {trace_dir} (train_gpt --trace {trace_dir})")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.5 * len(rows)))
    categories = list(next(iter(rows.values())))
    left = [0.0] * len(rows)
    ranks = sorted(rows)
    for k, c in enumerate(categories):
        widths = [rows[r][c] for r in ranks]
        ax.barh([f"rank {r}" for r in ranks], widths, left=left, color=f"C{k}", label=c)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("ms per step (mean, first step left out)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35 if len(rows) < 3 else -0.2), ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(output, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("kind", choices=["loss", "breakdown", "scaling"])
    p.add_argument("inputs", nargs="+", help="event-file directories (loss), a trace directory (breakdown) or "
                                             "bench/scaling.py --json rows (scaling)")
    p.add_argument("-o", "--output", required=True, help="the PNG to write")
    args = p.parse_args()
    for path in args.inputs:
        if not os.path.exists(path):
            print(f"plot: {path} does not exist", file=sys.stderr)
            return 2
    if args.kind == "loss":
        plot_loss(args.inputs, args.output)
    elif args.kind == "breakdown":
        plot_breakdown(args.inputs[0], args.output)
    else:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
        import scaling
        rows = json.load(open(args.inputs[0]))
        scaling.plot(rows if isinstance(rows, list) else rows["rows"], args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
