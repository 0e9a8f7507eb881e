#!/usr/bin/env python3
"""Where a GPU step's time goes, from the GPU check's raw files (scripts/gpu-run.sh); the standard library only.

    scripts/gpu_profile.py blocks report/trace/rank0.json      # each block's forward and backward device time
    scripts/gpu_profile.py kernels ncu.csv --top 15            # per-kernel times from ncu --csv --page raw

blocks: the trace's spans on the device tracks ("device 0: compute stream", core/cuda/trace_hooks.cpp), named
"block N forward" / "block N backward", and the step's phases (forward, backward, optimizer). The first step is
left out (allocation, cuBLAS's heuristics); each figure is the median over the remaining steps, in ms, beside the
host span of the same name.

kernels: ncu's raw page with the metric gpu__time_duration.sum; kernels with the same name are added up, then
listed by total time with their count, mean and share of the profiled total.

Exit status: 0, 1 when the file holds nothing to summarise, 2 on bad usage.
"""
import argparse
import collections
import csv
import json
import re
import statistics
import sys


def device_blocks(path):
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    tracks = {(e.get("pid"), e.get("tid")): e["args"]["name"] for e in events
              if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = collections.defaultdict(lambda: collections.defaultdict(list))  # name -> "device"/"host" -> [ms]
    wanted = re.compile(r"^(block \d+ (forward|backward)|forward|backward|optimizer|step \d+|step)$")
    for e in events:
        if e.get("ph") != "X" or not wanted.match(e.get("name", "")):
            continue
        track = tracks.get((e.get("pid"), e.get("tid")), "")
        kind = "device" if track.startswith("device ") else "host"
        name = "step" if e["name"].startswith("step") else e["name"]
        spans[name][kind].append((e["ts"], e.get("dur", 0) / 1000.0))
    if not spans:
        print(f"{path}: no block, step or phase spans", file=sys.stderr)
        return 1
    if not any(v["device"] for v in spans.values()):
        print(f"{path}: no span on a device track (a trace from a CPU run?)", file=sys.stderr)
        return 1

    def order(name):
        m = re.match(r"block (\d+) (forward|backward)", name)
        if m:
            return (1, int(m.group(1)) if m.group(2) == "forward" else 1000 - int(m.group(1)), name)
        return ({"step": 0, "forward": 2, "backward": 3, "optimizer": 4}.get(name, 5), 0, name)

    def median_after_first(values):
        values = [d for _, d in sorted(values)]
        values = values[1:] if len(values) > 1 else values
        return statistics.median(values) if values else float("nan"), len(values)

    print(f"{'span':<22} {'device ms':>10} {'host ms':>9} {'steps':>6}")
    for name in sorted(spans, key=order):
        dev, n = median_after_first(spans[name]["device"])
        host, _ = median_after_first(spans[name]["host"])
        print(f"{name:<22} {dev:10.3f} {host:9.3f} {n:6d}")
    return 0


def ncu_kernels(path, top):
    with open(path, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    start = next((i for i, l in enumerate(lines) if '"Kernel Name"' in l), None)
    if start is None:
        print(f"{path}: no CSV header with a \"Kernel Name\" column (ncu --csv --page raw)", file=sys.stderr)
        return 1
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    try:
        name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
    except ValueError:
        print(f"{path}: the columns Kernel Name and gpu__time_duration.sum are not both there", file=sys.stderr)
        return 1
    unit = rows[1][time_col] if len(rows) > 1 and not rows[1][0].strip().isdigit() else "ns"
    scale = {"ns": 1e-6, "nsecond": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0}.get(unit, 1e-6)
    totals, counts = collections.Counter(), collections.Counter()
    for r in rows[1:]:
        if len(r) <= max(name_col, time_col) or not r[0].strip().isdigit():
            continue
        try:
            ms = float(r[time_col].replace(",", "")) * scale
        except ValueError:
            continue
        name = r[name_col]
        name = name if len(name) <= 90 else name[:87] + "..."
        totals[name] += ms
        counts[name] += 1
    if not totals:
        print(f"{path}: no kernel rows", file=sys.stderr)
        return 1
    whole = sum(totals.values())
    print(f"{sum(counts.values())} kernels, {len(totals)} distinct, {whole:.3f} ms of device time in all")
    print(f"{'total ms':>9} {'share':>6} {'count':>6} {'mean us':>9}  kernel")
    for name, ms in totals.most_common(top):
        print(f"{ms:9.3f} {100 * ms / whole:5.1f}% {counts[name]:6d} {1000 * ms / counts[name]:9.1f}  {name}")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("blocks", help="each block's device time from a train_gpt --trace file")
    b.add_argument("trace")
    k = sub.add_parser("kernels", help="per-kernel times from ncu's raw CSV")
    k.add_argument("csv")
    k.add_argument("--top", type=int, default=15, help="kernels listed (default 15)")
    a = p.parse_args()
    try:
        return device_blocks(a.trace) if a.what == "blocks" else ncu_kernels(a.csv, a.top)
    except (OSError, ValueError, KeyError) as e:
        print(f"gpu_profile: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
