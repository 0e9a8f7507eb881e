#!/usr/bin/env python3
"""scripts/minidl-exercise's skeletons against dist/naive/'s markers, found here with code of this test's own:
- the regions removed are exactly the markers' (every line outside a region is kept, in order, and each region
  becomes one MINIDL_TODO carrying its hint);
- a sentinel planted in every solution region (its first and last line) never reaches a skeleton, while one planted
  outside the regions does;
- start / reset / solution / list and bad input (an unknown exercise or command, a malformed marker: exit 2 naming
  what was expected) behave as the command's help says.
Runs in a temporary directory (MINIDL_EXERCISES_DIR, MINIDL_EXERCISE_SOURCES); needs no build.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "scripts", "minidl-exercise")
NAIVE = os.path.join(ROOT, "dist", "naive")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}")


def run(args, env):
    p = subprocess.run([sys.executable, TOOL] + args, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout + p.stderr


def markers(lines):
    """[(exercise, first line, end line)] by a scan of this test's own: '// EXERCISE(' opens, '// END EXERCISE' closes."""
    out, open_at = [], None
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("// EXERCISE("):
            assert open_at is None, f"nested marker at line {i + 1}"
            open_at = (s[len("// EXERCISE("):s.index(")")], i)
        elif s == "// END EXERCISE":
            out.append((open_at[0], open_at[1], i))
            open_at = None
    return out


def regions_removed_equal_the_markers(work, env):
    for name in os.listdir(work):
        for f in os.listdir(os.path.join(work, name)):
            original = open(os.path.join(NAIVE, f)).read().split("\n")
            skeleton = open(os.path.join(work, name, f)).read().split("\n")
            found = [m for m in markers(original) if m[0] == name]
            check(found, f"{f}: no marker of {name}")
            # The skeleton without its four prelude lines and its MINIDL_TODO statements must be the original
            # without its regions, line for line.
            kept = []
            at = 0
            for _, first, end in found:
                kept += original[at:first]
                kept.append("<TODO>")
                at = end + 1
            kept += original[at:]
            pragma = skeleton.index("#pragma once")
            prelude = skeleton[pragma + 1:pragma + 5]
            check(prelude[1:] == ['#include "core/exercise.h"', "#undef MINIDL_EXERCISE",
                                  f'#define MINIDL_EXERCISE "{name}"'], f"{f}: the skeleton's prelude: {prelude}")
            body = skeleton[:pragma + 1] + skeleton[pragma + 5:]
            collapsed, i = [], 0
            while i < len(body):  # a bare marker, one MINIDL_TODO statement, the end marker
                if body[i].strip() == f"// EXERCISE({name})":
                    j = i + 1
                    check(body[j].strip().startswith("MINIDL_TODO("), f"{f}:{j + 1}: no MINIDL_TODO after the marker")
                    while j < len(body) and not body[j].rstrip().endswith(");"):
                        j += 1
                    check(j + 1 < len(body) and body[j + 1].strip() == "// END EXERCISE",
                          f"{f}:{j + 2}: the MINIDL_TODO is not followed by the end marker")
                    collapsed.append("<TODO>")
                    i = j + 2
                else:
                    collapsed.append(body[i])
                    i += 1
            check(collapsed == kept, f"{f}: the skeleton is not the original with exactly its {len(found)} regions "
                                     "replaced")
            todos = re.findall(r'MINIDL_TODO\((.*?)\);', "\n".join(skeleton), re.S)
            check(len(todos) == len(found), f"{f}: {len(todos)} MINIDL_TODO for {len(found)} regions")
            for (_, first, _), todo in zip(found, todos):
                hint_word = original[first].split("): ", 1)[1].split()[0]
                check(hint_word in todo, f"{f}:{first + 1}: the MINIDL_TODO does not carry the hint ({todo[:60]})")


def sentinels_never_reach_a_skeleton(tmp):
    planted = os.path.join(tmp, "planted")
    shutil.copytree(NAIVE, planted)
    count = 0
    for f in os.listdir(planted):
        if not f.endswith(".h"):
            continue
        path = os.path.join(planted, f)
        lines = open(path).read().split("\n")
        out = []
        for i, line in enumerate(lines):
            s = line.strip()
            if s == "// END EXERCISE":
                out.append(f"    int sentinel_last_{count} = 0;  // SENTINEL-{f}-{count}-last")
            out.append(line)
            if s.startswith("// EXERCISE("):
                count += 1
                # after the hint block: the first line of the solution
                j = i + 1
                while j < len(lines) and lines[j].strip().startswith("//"):
                    j += 1
                lines.insert(j, f"    int sentinel_first_{count} = 0;  // SENTINEL-{f}-{count}-first")
        out.insert(out.index("#pragma once") + 1, "// CONTROL-SENTINEL outside every region")
        open(path, "w").write("\n".join(out))
    env = dict(os.environ, MINIDL_EXERCISE_SOURCES=planted, MINIDL_EXERCISES_DIR=os.path.join(tmp, "planted-work"))
    rc, out = run(["start-all"], env)
    check(rc == 0, f"start-all on the planted copy: exit {rc}: {out}")
    seen_control, leaked = 0, []
    for parent, _, files in os.walk(os.path.join(tmp, "planted-work")):
        for f in files:
            text = open(os.path.join(parent, f)).read()
            leaked += re.findall(r"SENTINEL-\S+", text)
            seen_control += "CONTROL-SENTINEL" in text
    expected = sum(len(markers(open(os.path.join(NAIVE, f)).read().split("\n"))) for f in os.listdir(NAIVE)
                   if f.endswith(".h"))
    check(count == expected and count > 0, f"{count} regions planted, expected every one of dist/naive/'s {expected}")
    check(not leaked, f"sentinels from solution regions in a skeleton: {leaked}")
    check(seen_control > 0, "the control sentinel outside the regions reached no skeleton (the test sees nothing)")


def commands(tmp):
    work = os.path.join(tmp, "work")
    env = dict(os.environ, MINIDL_EXERCISES_DIR=work)
    rc, out = run(["list"], env)
    check(rc == 0 and "ring" in out and "pipeline" in out, f"list: exit {rc}: {out}")
    rc, out = run(["start", "ring"], env)
    check(rc == 0 and os.path.isfile(os.path.join(work, "ring", "ring.h")), f"start ring: exit {rc}: {out}")
    rc, out = run(["start", "ring"], env)
    check(rc == 1 and "reset ring" in out, f"start ring again: exit {rc} (expected 1, naming reset): {out}")
    with open(os.path.join(work, "ring", "ring.h"), "a") as f:
        f.write("// my work\n")
    rc, out = run(["reset", "ring"], env)
    moved = [d for d in os.listdir(os.path.join(work, ".previous"))] if os.path.isdir(os.path.join(work, ".previous")) else []
    check(rc == 0 and moved and "// my work" not in open(os.path.join(work, "ring", "ring.h")).read(),
          f"reset ring: exit {rc}, moved aside: {moved}: {out}")
    rc, out = run(["solution", "ring"], env)
    check(rc == 0 and "ring_chunk(buffer, n, r - s - 2)" in out, f"solution ring: exit {rc}: {out[:200]}")
    rc, out = run(["start", "rnig"], env)
    check(rc == 2 and "no exercise named 'rnig'" in out and "ring, ddp" in out, f"unknown exercise: exit {rc}: {out}")
    rc, out = run(["frobnicate"], env)
    check(rc == 2 and "unknown command 'frobnicate'" in out and "list, start, check" in out,
          f"unknown command: exit {rc}: {out}")
    rc, out = run(["start"], env)
    check(rc == 2 and "needs an exercise name" in out, f"start without a name: exit {rc}: {out}")
    bad = os.path.join(tmp, "bad")
    os.makedirs(bad)
    open(os.path.join(bad, "x.h"), "w").write("#pragma once\n// EXERCISE(x): hint\nint a;\n")
    rc, out = run(["list"], dict(env, MINIDL_EXERCISE_SOURCES=bad))
    check(rc == 2 and "x.h:2" in out and "END EXERCISE" in out, f"a marker without its end: exit {rc}: {out}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        work = os.path.join(tmp, "all")
        env = dict(os.environ, MINIDL_EXERCISES_DIR=work)
        rc, out = run(["start-all"], env)
        check(rc == 0, f"start-all: exit {rc}: {out}")
        regions_removed_equal_the_markers(work, env)
        sentinels_never_reach_a_skeleton(tmp)
        commands(tmp)
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} problem(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
