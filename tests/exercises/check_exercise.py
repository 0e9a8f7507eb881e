#!/usr/bin/env python3
"""`minidl-exercise check` end to end, for CTest (tests/exercises/CMakeLists.txt):

    check_exercise.py solution NAME   # the reference's files in a learner's folder: every criterion passes, exit 0,
                                      # three runs in a row
    check_exercise.py skeleton NAME   # the untouched skeleton: nothing passes but `compiles`, exit 1, within 60 s,
                                      # every failure "not written yet" (no hang, no crash)
    check_exercise.py mutants NAME    # each planted defect of scripts/exercise_mutants.txt: its criterion rejects
                                      # it with the status and message the list names (at one world size at least)
    check_exercise.py bad_input ring  # code that does not compile (compiles failed with the compiler's first
                                      # lines, the rest blocked), a changed signature (the expected one named), a
                                      # flood of output (capped in the report)
MINIDL_BUILD_DIR names the build tree (CTest sets it).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "scripts", "minidl-exercise")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import exercise_regions as er  # noqa: E402


def mutants(name):
    text = open(os.path.join(ROOT, "scripts", "exercise_mutants.txt"), encoding="utf-8").read()
    blocks = [b for b in text.split("\n\n") if b.strip() and not b.lstrip().startswith("#")]
    out = []
    for b in blocks:
        lines = b.strip("\n").split("\n")
        head = [f.strip() for f in lines[0].split(" ; ")]
        if len(lines) != 3 or len(head) != 5 or not lines[1].startswith("- ") or not lines[2].startswith("+ "):
            sys.exit(f"exercise_mutants.txt: malformed entry:\n{b}")
        out.append(head + [lines[1][2:].replace("\\n", "\n"), lines[2][2:].replace("\\n", "\n")])
    return out


def check(name, work, extra=()):
    report = os.path.join(work, "report.json")
    env = dict(os.environ, MINIDL_EXERCISES_DIR=work)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, TOOL, "check", name, "--json", report, *extra], capture_output=True,
                       text=True, env=env)
    print(p.stdout + p.stderr)
    rows = json.load(open(report))["criteria"] if os.path.isfile(report) else []
    return p.returncode, rows, time.monotonic() - t0


def main(mode, name):
    files = er.exercises(os.path.join(ROOT, "dist", "naive"))[name]
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "solution":
            os.makedirs(os.path.join(tmp, name))
            for f in files:
                shutil.copy(os.path.join(ROOT, "dist", "naive", f), os.path.join(tmp, name, f))
            rc, rows, _ = check(name, tmp, ["--repeat", "3"])  # three runs in a row, against races
            if rc != 0 or not rows or any(r["status"] != "passed" for r in rows):
                problems.append(f"the reference does not pass three runs in a row: exit {rc}")
        elif mode == "skeleton":
            subprocess.run([sys.executable, TOOL, "start", name], env=dict(os.environ, MINIDL_EXERCISES_DIR=tmp),
                           check=True, capture_output=True)
            rc, rows, seconds = check(name, tmp)
            graded = [r for r in rows if r["id"] != "compiles"]
            if rc != 1 or not graded or rows[0]["status"] != "passed":
                problems.append(f"the skeleton: exit {rc} (expected 1), compiles {rows[0]['status'] if rows else '?'}")
            wrong = [r["id"] for r in graded if r["status"] != "failed" or "not written yet" not in r["reason"]]
            if wrong:
                problems.append(f"criteria not failed as 'not written yet': {', '.join(wrong)}")
            if seconds > 60:
                problems.append(f"the skeleton took {seconds:.0f} s (at most 60)")
        elif mode == "bad_input":
            solution = open(os.path.join(ROOT, "dist", "naive", "ring.h"), encoding="utf-8").read()
            cases = [
                ("syntax", solution.replace("const int n = group.size(), r = group.rank();\n  for (int s = 0;",
                                            "const int n = group.size(), r = group.rank()\n  for (int s = 0;", 1),
                 lambda rows: rows[0]["status"] == "failed" and "error" in rows[0]["reason"]
                 and 0 < len(rows[0]["log"].splitlines()) <= 20 and len(rows) > 1
                 and all(r["status"] == "blocked" for r in rows[1:])),
                ("signature", solution.replace("inline void ring_all_gather(ProcessGroup& group, Tensor& buffer) {",
                                               "inline void ring_all_gather(ProcessGroup& group, Tensor& buffer, int t) {"),
                 lambda rows: rows[0]["status"] == "failed" and "a signature changed: expected `inline void "
                 "ring_all_gather(ProcessGroup& group, Tensor& buffer) {`" in rows[0]["reason"]),
                ("flood", solution.replace("  const int n = group.size(), r = group.rank();\n  for (int s = 0;",
                                           "  for (int k = 0; k < 200000; ++k) std::printf(\"flood %d\\n\", k);\n"
                                           "  const int n = group.size(), r = group.rank();\n  for (int s = 0;", 1),
                 lambda rows: all(r["status"] == "passed" for r in rows)),
            ]
            for case, text, ok in cases:
                if text == solution:
                    problems.append(f"bad_input {case}: its edit no longer applies to dist/naive/ring.h")
                    continue
                work = os.path.join(tmp, case)
                os.makedirs(os.path.join(work, "ring"))
                open(os.path.join(work, "ring", "ring.h"), "w", encoding="utf-8").write(text)
                rc, rows, _ = check("ring", work, ["--only", "reduce_scatter"] if case == "flood" else [])
                if rc == 2 or not rows or not ok(rows):
                    problems.append(f"bad_input {case}: exit {rc}, " + "; ".join(
                        f"{r['id']} {r['status']}: {r['reason'][:200]}" for r in rows[:3]))
                if case == "flood" and os.path.getsize(os.path.join(work, "report.json")) > 100_000:
                    problems.append("bad_input flood: the report is not capped")
        else:
            chosen = [m for m in mutants(name) if m[1] in files]
            if len(chosen) < 2:
                problems.append(f"{len(chosen)} planted defects of {name} (expected at least 2)")
            for mname, f, criterion, status, fragment, old, new in chosen:
                work = os.path.join(tmp, mname)
                os.makedirs(os.path.join(work, name))
                for g in files:
                    text = open(os.path.join(ROOT, "dist", "naive", g), encoding="utf-8").read()
                    if g == f:
                        if text.count(old) != 1:
                            problems.append(f"{mname}: its text occurs {text.count(old)} times in {f} (expected once)")
                            continue
                        text = text.replace(old, new)
                    open(os.path.join(work, name, g), "w", encoding="utf-8").write(text)
                rc, rows, _ = check(name, work, ["--only", criterion])
                hits = [r for r in rows if r["status"] == status and fragment in r["reason"]]
                # Caught when the criterion rejects it with its message at one world size at least (at another the
                # same bug may show otherwise: a count mismatch that N = 3 happens to hide shows as a wrong sum).
                verdict = "caught" if rc == 1 and hits else "NOT CAUGHT as intended"
                print(f"{mname}: {verdict} by {criterion} ({len(hits)} of {len(rows) - 1} world sizes): "
                      f"{hits[0]['reason'] if hits else ''}")
                if verdict != "caught":
                    problems.append(f"{mname}: expected {criterion} {status} with '{fragment}', got "
                                    + "; ".join(f"{r['id']} {r['status']}: {r['reason'][:200]}" for r in rows))
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("solution", "skeleton", "mutants", "bad_input"):
        print(__doc__.strip(), file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
