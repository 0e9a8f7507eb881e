#!/usr/bin/env python3
"""Joins the per-rank Chrome traces of a train_gpt --trace DIR run into one file (every rank a process).

    scripts/merge_traces.py DIR [-o merged.json]      # then open it in https://ui.perfetto.dev or chrome://tracing

The ranks started their clocks together (at a barrier just before the first step, core/trace.h), so the events
need no shifting: each keeps its own process id (the rank).
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
    for path in files:
        with open(path) as f:
            events += json.load(f)["traceEvents"]
    output = args.output or os.path.join(args.directory, "merged.json")
    with open(output, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    print(f"{output}: {len(events)} events from {len(files)} ranks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
