#!/usr/bin/env python3
"""Reads the flight recorders a minidl job's watchdog wrote and says which collective is stuck and who is missing.

    scripts/flight_recorder.py DEBUG_DIR            # the directory of flight-rank<R>.json and progress-rank<R>.json
    scripts/flight_recorder.py DEBUG_DIR --json     # the same as one JSON object

Each rank's dump (dist/flight_recorder.h) holds its last N calls per process group (group label, sequence number,
op, dtype, count, peer, state) and, per group, the last sequence number it called and completed. For every group
the analysis finds the first sequence number not completed everywhere, the ranks that called it (joined) and
those that did not (missing: a rank whose dump or progress file shows an earlier last call, or that left neither);
calls that two ranks made under the same sequence number but differ in op, count, dtype or peer (a mismatch); and
each rank's last completed call. A ring that wrapped (its oldest entries dropped) and missing files are said so.
Exit status 0 when something was found stuck or mismatched, 1 when everything completed, 2 for bad input.
"""
import argparse
import glob
import json
import os
import re
import sys


def load(directory):
    """Per rank: its dump (or None) and its progress file (or None)."""
    ranks = {}
    for kind in ("flight", "progress"):
        for path in glob.glob(os.path.join(directory, f"{kind}-rank*.json")):
            m = re.search(r"-rank(\d+)\.json$", path)
            if not m:
                continue
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                print(f"flight_recorder: {path}: unreadable ({e})", file=sys.stderr)
                continue
            ranks.setdefault(int(m.group(1)), {})[kind] = data
    return ranks


def fingerprint(e):
    return (e["op"], e["dtype"], e["count"], e["peer"], e["reduce_op"])


def describe(e):
    s = f'{e["op"]} {e["dtype"]} x {e["count"]}'
    if e["reduce_op"]:
        s += f' ({e["reduce_op"]})'
    if e["peer"] >= 0:
        s += f' peer {e["peer"]}'
    return s


def analyse(ranks):
    report = {"ranks_with_dumps": sorted(r for r, d in ranks.items() if "flight" in d), "groups": [], "notes": []}
    # Every group some rank knows, with its world ranks (a label names one group per rank: dp of rank 0 is {0, 2}).
    groups = {}
    for r, d in sorted(ranks.items()):
        source = d.get("flight") or d.get("progress")
        for label, g in source.get("groups", {}).items():
            groups.setdefault((label, tuple(g["ranks"])), None)
    for r, d in sorted(ranks.items()):
        if "flight" in d:
            entries = d["flight"]["entries"]
            if len(entries) >= d["flight"].get("capacity", 1 << 60):
                report["notes"].append(f"rank {r}'s ring wrapped: its oldest calls were dropped")
    for (label, members) in sorted(groups):
        called, completed, by_seq = {}, {}, {}
        for r in members:
            d = ranks.get(r, {})
            source = d.get("flight") or d.get("progress")
            if source is None or label not in source.get("groups", {}):
                continue
            g = source["groups"][label]
            called[r], completed[r] = g["called"], g["completed"]
            for e in d.get("flight", {}).get("entries", []):
                if e["group"] == label and e["op"] not in ("send", "recv"):  # sends and receives count apart
                    by_seq.setdefault(e["seq"], {})[r] = e
        if not called:
            continue
        # The first call some rank that dumped is still waiting in (a progress file can be a second stale: only the
        # dumps say what is open).
        waiting = [completed[r] + 1 for r in members
                   if "flight" in ranks.get(r, {}) and r in called and called[r] > completed[r]]
        stuck = min(waiting) if waiting else None
        # Missing: a rank that has not called it, or (when others dumped) one that wrote no dump: its watchdog did not
        # run, so the rank is stopped, dead or stuck outside minidl.
        dumped = any("flight" in ranks.get(r, {}) for r in members)
        # The watchdogs' verdicts: each rank whose watchdog fired on this call named the ranks it found missing
        # (their progress files); a rank most of them named is missing (it may have dumped later itself: a stopped
        # rank that is continued to be killed fires too).
        verdicts = [d["flight"]["timeout"] for r in members for d in [ranks.get(r, {})]
                    if "flight" in d and d["flight"].get("timeout", {}).get("group") == label
                    and d["flight"]["timeout"].get("seq") == stuck]
        named = {r for r in members if verdicts and
                 2 * sum(r in v.get("named_ranks", []) for v in verdicts) > len(verdicts)}
        missing = sorted(r for r in members if stuck is not None and (
            r not in called or called[r] < stuck or r in named or (dumped and "flight" not in ranks.get(r, {}))))
        joined = sorted(r for r in called if stuck is not None and called[r] >= stuck and r not in missing)
        mismatches = []
        for seq, calls in sorted(by_seq.items()):
            prints = {}
            for r, e in calls.items():
                prints.setdefault(fingerprint(e), []).append(r)
            if len(prints) > 1:
                mismatches.append({"seq": seq, "calls": [{"ranks": rs, "call": describe(calls[rs[0]])}
                                                         for rs in prints.values()]})
        entry = {"group": label, "ranks": list(members), "stuck_seq": stuck, "joined": joined,
                 "missing": missing if stuck is not None else [], "mismatches": mismatches,
                 "no_files": [r for r in members if r not in ranks]}
        if stuck is not None and stuck in by_seq:
            entry["stuck_call"] = describe(next(iter(by_seq[stuck].values())))
        last = {}
        for r in members:
            done = [e for e in ranks.get(r, {}).get("flight", {}).get("entries", [])
                    if e["group"] == label and e["state"] == "completed" and e["op"] not in ("send", "recv")]
            if done:
                last[r] = f'seq {done[-1]["seq"]} {describe(done[-1])}'
        entry["last_completed"] = last
        # Sends and receives still open on a dumped rank: each waits for its one peer.
        entry["open_p2p"] = [f'rank {r}: {describe(e)} (group rank {e["peer"]} is the peer)'
                             for r in members for e in ranks.get(r, {}).get("flight", {}).get("entries", [])
                             if e["group"] == label and e["op"] in ("send", "recv") and e["state"] == "enqueued"]
        report["groups"].append(entry)
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="the watchdog's debug directory (--debug-dir / MINIDL_DEBUG_DIR)")
    parser.add_argument("--json", action="store_true", help="print the analysis as JSON")
    args = parser.parse_args()
    if not os.path.isdir(args.directory):
        print(f"flight_recorder: {args.directory} is not a directory", file=sys.stderr)
        return 2
    ranks = load(args.directory)
    if not any("flight" in d for d in ranks.values()):
        print(f"flight_recorder: no flight-rank*.json in {args.directory} (the watchdog writes them on a timeout)",
              file=sys.stderr)
        return 2
    report = analyse(ranks)
    found = any(g["stuck_seq"] is not None or g["mismatches"] or g["open_p2p"] for g in report["groups"])
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if found else 1
    print(f'dumps from ranks {report["ranks_with_dumps"]}')
    for note in report["notes"]:
        print(f"note: {note}")
    for g in report["groups"]:
        head = f'group {g["group"]} (ranks {g["ranks"]})'
        if g["stuck_seq"] is not None:
            call = g.get("stuck_call", "?")
            print(f'{head}: not all ranks joined collective {g["stuck_seq"]} ({call}); joined: {g["joined"]}; '
                  f'missing ranks: {g["missing"]}')
        for p in g["open_p2p"]:
            print(f'{head}: still waiting: {p}')
        for m in g["mismatches"]:
            sides = "; ".join(f'ranks {c["ranks"]}: {c["call"]}' for c in m["calls"])
            print(f'{head}: sequence {m["seq"]} differs across ranks: {sides}')
        if g["stuck_seq"] is not None or g["mismatches"]:
            for r, last in sorted(g["last_completed"].items()):
                print(f"  rank {r} last completed {last}")
            if g["no_files"]:
                print(f'  no dump or progress file from ranks {g["no_files"]}')
    if not found:
        print("every call completed on every rank that wrote a dump")
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
