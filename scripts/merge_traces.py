#!/usr/bin/env python3
"""Joins the per-rank Chrome traces of a train_gpt --trace DIR run into one file (every rank a process).

    scripts/merge_traces.py DIR [-o merged.json]      # then open it in https://ui.perfetto.dev or chrome://tracing

The ranks start their clocks at a barrier, but not quite together: each file records its clock's offset from
rank 0's, measured by ping-pongs at the start (dist/clock_sync.h, in "otherData": clock_offset_us), and the merged
file adds it to the rank's timestamps, so every event is on rank 0's clock. Each rank keeps its process id.
"""
import argparse
import glob
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="the --trace directory (rank<R>.json files)")
    parser.add_argument("-o", "--output", help="where to write the merged trace (default: DIR/merged.json)")
    args = parser.parse_args()
    files = sorted(glob.glob(os.path.join(args.directory, "rank*.json")))
    if not files:
        print(f"merge_traces: no rank*.json in {args.directory}", file=sys.stderr)
        return 2
    events = []
    offsets = {}
    for path in files:
        with open(path) as f:
            trace = json.load(f)
        offset = trace.get("otherData", {}).get("clock_offset_us", 0.0)
        offsets[os.path.basename(path)] = offset
        for e in trace["traceEvents"]:
            if "ts" in e:
                e["ts"] += offset
            events.append(e)
    output = args.output or os.path.join(args.directory, "merged.json")
    with open(output, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    shifts = ", ".join(f"{name} {offset:+.1f} us" for name, offset in offsets.items())
    print(f"{output}: {len(events)} events from {len(files)} ranks (clock offsets {shifts})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
