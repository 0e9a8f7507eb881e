"""The exercise regions of minidl's teaching files (dist/naive/), and the skeletons made from them.

A solution file marks each region a learner writes:

    // EXERCISE(ring): the hint, a comment block that may run over
    // several lines (it ends at the first line that is not a comment)
    ...the solution...
    // END EXERCISE

A skeleton is the file with each region's hint and solution replaced by one statement, MINIDL_TODO("the hint"),
between bare markers (`// EXERCISE(ring)` ... `// END EXERCISE`: where the learner writes, and how the grader finds
a learner's regions to give a criterion the reference's for the parts it does not grade). MINIDL_TODO throws a
NotImplementedError naming the exercise and the function (core/exercise.h); the skeleton defines MINIDL_EXERCISE
right after its `#pragma once`. Everything outside the regions (signatures, derivation comments) is kept line for
line. One file holds the regions of one exercise only.

scripts/minidl-exercise is the command; tests/exercises/test_exercise_tool.py checks this module independently.
"""
import os
import re

MARK = re.compile(r"^(\s*)// EXERCISE\(([a-z0-9_]+)\)(?:: ?(.*))?$")
END = re.compile(r"^\s*// END EXERCISE\s*$")
COMMENT = re.compile(r"^\s*// ?(.*)$")
# The order of docs/exercises.md: the ring first (every other file all-reduces), the pipeline last.
ORDER = ["ring", "ddp", "ddp_overlap", "zero1", "zero3", "tensor_parallel", "pipeline", "ring_attention"]
COLUMNS = 120


class RegionError(Exception):
    """A malformed marker: the message names file:line, what was expected and what was found."""


class Region:
    def __init__(self, path, exercise, indent, hint, first, body_first, end):
        self.path, self.exercise, self.indent, self.hint = path, exercise, indent, hint
        self.first = first            # 0-based index of the marker line
        self.body_first = body_first  # first line of the solution (after the hint block)
        self.end = end                # index of the END EXERCISE line

    def body(self, lines):
        return lines[self.body_first:self.end]


def parse(path, text, learner=False):
    """The regions of one file, in order. Raises RegionError for a marker without its end, an end without its
    marker, a nested marker, an empty region or regions of two exercises in one file. A learner's file (a skeleton
    being written) may have markers without a hint."""
    lines = text.split("\n")
    regions, i, name = [], 0, os.path.basename(path)
    while i < len(lines):
        m = MARK.match(lines[i])
        if END.match(lines[i]):
            raise RegionError(f"{name}:{i + 1}: '// END EXERCISE' without an '// EXERCISE(name): hint' before it")
        if not m:
            i += 1
            continue
        indent, exercise, hint = m.group(1), m.group(2), [(m.group(3) or "").strip()]
        j = i + 1
        while j < len(lines) and COMMENT.match(lines[j]) and not END.match(lines[j]) and not MARK.match(lines[j]):
            hint.append(COMMENT.match(lines[j]).group(1).strip())
            j += 1
        body_first = j
        while j < len(lines) and not END.match(lines[j]):
            if MARK.match(lines[j]):
                raise RegionError(f"{name}:{j + 1}: a marker inside the region opened at line {i + 1} "
                                  "(expected '// END EXERCISE' first)")
            j += 1
        if j == len(lines):
            raise RegionError(f"{name}:{i + 1}: region {exercise} has no '// END EXERCISE'")
        if j == body_first and not learner:
            raise RegionError(f"{name}:{i + 1}: region {exercise} is empty (expected the solution between the "
                              "hint and '// END EXERCISE')")
        if not learner and not " ".join(hint).strip():
            raise RegionError(f"{name}:{i + 1}: region {exercise} has no hint (expected '// EXERCISE(name): hint')")
        regions.append(Region(path, exercise, indent, " ".join(h for h in hint if h), i, body_first, j))
        i = j + 1
    names = sorted({r.exercise for r in regions})
    if len(names) > 1:
        raise RegionError(f"{name}: regions of {len(names)} exercises ({', '.join(names)}); expected one per file")
    return regions


def c_string_lines(text, indent, prefix):
    """`prefix("text");` as C++ lines within COLUMNS: adjacent string literals when it does not fit on one."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    one = f'{indent}{prefix}("{escaped}");'
    if len(one) <= COLUMNS:
        return [one]
    inner, width = indent + "    ", COLUMNS - len(indent) - 4 - 3  # the quotes, and ");" on the last
    pieces, words, current = [], escaped.split(" "), ""
    for w in words:
        candidate = w if not current else current + " " + w
        if len(candidate) + 1 > width and current:
            pieces.append(current + " ")
            current = w
        else:
            current = candidate
    pieces.append(current)
    out = [f"{indent}{prefix}("] + [f'{inner}"{p}"' for p in pieces]
    out[-1] += ");"
    return out


def skeleton(path, text, exercise):
    """The file with every region of `exercise` replaced by MINIDL_TODO("hint") between bare markers (so the grader
    can still find the learner's regions, and give a criterion the reference's for the parts it does not grade),
    and MINIDL_EXERCISE defined."""
    lines = text.split("\n")
    regions = [r for r in parse(path, text) if r.exercise == exercise]
    out, at = [], 0
    for r in regions:
        out += lines[at:r.first]
        out.append(f"{r.indent}// EXERCISE({exercise})")
        out += c_string_lines(r.hint, r.indent, "MINIDL_TODO")
        out.append(f"{r.indent}// END EXERCISE")
        at = r.end + 1
    out += lines[at:]
    try:
        pragma = out.index("#pragma once")
    except ValueError:
        raise RegionError(f"{os.path.basename(path)}: expected a '#pragma once' line to put the skeleton's "
                          "definitions after") from None
    out[pragma + 1:pragma + 1] = [
        f"// The skeleton of exercise {exercise} (scripts/minidl-exercise): write each MINIDL_TODO; "
        "docs/exercises.md.",
        '#include "core/exercise.h"',
        "#undef MINIDL_EXERCISE",
        f'#define MINIDL_EXERCISE "{exercise}"',
    ]
    return "\n".join(out)


def exercises(naive_dir):
    """{exercise: [file names]}, in ORDER (unknown names after, sorted), from the markers of naive_dir/*.h."""
    found = {}
    for f in sorted(os.listdir(naive_dir)):
        if not f.endswith(".h"):
            continue
        path = os.path.join(naive_dir, f)
        for r in parse(path, open(path, encoding="utf-8").read()):
            found.setdefault(r.exercise, [])
            if f not in found[r.exercise]:
                found[r.exercise].append(f)
    rank = {n: i for i, n in enumerate(ORDER)}
    return {n: found[n] for n in sorted(found, key=lambda n: (rank.get(n, len(ORDER)), n))}


def with_reference_regions(learner_text, reference_text, path, indices):
    """The learner's file with its regions number `indices` (1-based, in file order) replaced by the reference's.
    None when the learner's file does not have the reference's number of regions (markers deleted or added)."""
    mine, theirs = parse(path, learner_text, learner=True), parse(path, reference_text)
    if len(mine) != len(theirs):
        return None
    lines, ref = learner_text.split("\n"), reference_text.split("\n")
    for k in sorted(indices, reverse=True):  # from the end, so earlier line numbers stay put
        a, b = mine[k - 1], theirs[k - 1]
        lines[a.body_first:a.end] = b.body(ref)
    return "\n".join(lines)
