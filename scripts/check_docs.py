#!/usr/bin/env python3
"""Checks that the Markdown files cannot drift from the tree: the paths, links, line counts and flags they name.

    scripts/check_docs.py            # exit 1 naming each problem as file:line

The documents: README.md, docs/*.md and every README.md in a source folder (dist/naive/README.md, ...). Four checks:
- a repository path: a backticked token with a slash whose first folder is one of the repository's (core/, train/,
  scripts/, ...), without placeholders (<...>, *, DIR, N, ...), must exist. A token that names a symbol after the
  path (`train/step.h: train_step`) is cut at the first space or colon.
- a relative link `[text](target)` must name a file that exists, relative to the document.
- a line count, a path followed by its lines in parentheses (`dist/ddp.h` (66)), must be within 10% (or 5 lines)
  of the file's, so the reading paths' sizes stay true.
- a `train_gpt` flag: every --flag on a command line that runs train_gpt, and every --flag in the first column of
  the flag table under "## train_gpt", must be one examples/train_gpt.cpp declares (add_option / add_flag); and
  every flag it declares must have a row in that table (docs/train_gpt.md).
- a quoted program: a code block right after a line `<!-- from PATH -->` must appear, line for line, in PATH (a
  program CI builds and runs), so the docs show code that compiles.
- a header example: in the opening comment of every header of the library layers, each function an example line
  (`//   code`) calls after `::`, `.` or `->` must be one the code defines somewhere (`Tensor::randn` once named a
  factory that did not exist); calls into the standard library are not checked.
"""
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_FOLDERS = {"build", "build-asan", "build-bundle", "build-install", "build-cpu"}
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|…|\bDIR\b|\bFILE\b|\bN\b|XXXX|step-0")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
COUNTED = re.compile(r"`([^`\s]+)` \((\d+)\)")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
FROM = re.compile(r"^<!-- from (\S+) -->\s*$")
LAYERS = ["core", "ops", "autograd", "nn", "optim", "data", "dist", "train", "predict"]


def documents(folders):
    docs = [os.path.join(ROOT, "README.md")]
    docs += sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    for folder in sorted(folders):
        for parent, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            docs += [os.path.join(parent, f) for f in files if f == "README.md"]
    return [d for d in docs if not d.startswith(os.path.join(ROOT, "docs") + os.sep) or d.endswith(".md")]


def train_gpt_flags():
    source = open(os.path.join(ROOT, "examples", "train_gpt.cpp"), encoding="utf-8").read()
    flags = {"--help", "-h"}
    for names in re.findall(r'add_(?:option|flag)\(\s*"([^"]+)"', source):
        flags.update(n.lstrip("!") for n in names.split(","))
    return flags


def line_count(path):
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def quoted_blocks(doc):
    """Problems with the code blocks a `<!-- from PATH -->` line says come from PATH."""
    problems, lines = [], open(doc, encoding="utf-8").read().split("\n")
    for i, line in enumerate(lines):
        m = FROM.match(line)
        if not m:
            continue
        where = f"{os.path.relpath(doc, ROOT)}:{i + 1}"
        source = os.path.join(ROOT, m.group(1))
        if i + 1 >= len(lines) or not lines[i + 1].startswith("```") or not os.path.isfile(source):
            problems.append(f"{where}: expected a code block from the file {m.group(1)}")
            continue
        end = next((j for j in range(i + 2, len(lines)) if lines[j].startswith("```")), len(lines))
        block = "\n".join(lines[i + 2:end])
        if block not in open(source, encoding="utf-8").read():
            problems.append(f"{where}: the code block is not in {m.group(1)} as written (copy it again)")
    return problems


def header_examples():
    """Problems with the functions the header examples call."""
    headers = [p for layer in LAYERS for p in sorted(glob.glob(os.path.join(ROOT, layer, "**", "*.h"), recursive=True))]
    sources = headers + [p for layer in LAYERS for p in glob.glob(os.path.join(ROOT, layer, "**", "*.cpp"), recursive=True)]
    defined = set()
    for path in sources:
        for line in open(path, encoding="utf-8", errors="replace"):
            defined.update(re.findall(r"\b([A-Za-z_]\w*)\s*[(<{]", line.split("//")[0]))
    problems = []
    for path in headers:
        for number, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
            if line.startswith(("#", "namespace")):
                break  # the opening comment is over
            if not line.startswith("//   "):
                continue
            for qualifier, name in re.findall(r"(\w*)(?:::|\.|->)\s*([A-Za-z_]\w*)\s*\(", line[5:].split("//")[0]):
                if qualifier != "std" and name not in defined:
                    problems.append(f"{os.path.relpath(path, ROOT)}:{number}: the example calls {name}(), which "
                                    "nothing defines")
    return problems


def check(doc, folders, flags, tabled):
    problems = quoted_blocks(doc)
    rel = os.path.relpath(doc, ROOT)
    in_flag_table = False
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        where = f"{rel}:{number}"
        if line.startswith("#"):
            in_flag_table = line.strip() == "## train_gpt"
        for token in re.findall(r"`([^`]+)`", line):
            path = re.split(r"[ :(,]", token.strip())[0].rstrip(".")
            if "/" in path and not PLACEHOLDER.search(path) and path.split("/")[0] in folders:
                if not os.path.exists(os.path.join(ROOT, path)):
                    problems.append(f"{where}: no such path: {path}")
        for target in LINK.findall(line):
            target = target.split("#")[0]
            if target and "://" not in target and not os.path.exists(os.path.join(os.path.dirname(doc), target)):
                problems.append(f"{where}: broken link: {target}")
        for path, stated in COUNTED.findall(line):
            full = os.path.join(ROOT, path)
            if os.path.isfile(full):
                actual, stated = line_count(full), int(stated)
                if abs(actual - stated) > max(5, 0.1 * actual):
                    problems.append(f"{where}: {path} has {actual} lines, the text says {stated}")
        named = []
        if re.search(r"(^|[\s/])train_gpt(\s|$)", line) and re.search(r"bin/train_gpt|demo\.sh", line):
            named = FLAG.findall(line.split("#")[0].split("train_gpt", 1)[1])
        elif in_flag_table and line.startswith("| `--"):
            named = FLAG.findall(line.split("|")[1])
            tabled.update(named)
        for flag in named:
            if flag not in flags:
                problems.append(f"{where}: train_gpt has no flag {flag}")
    return problems


def main():
    folders = {d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")}
    folders = {d for d in folders - BUILD_FOLDERS if not d.startswith("build")}  # .gitignore: /build*/
    flags = train_gpt_flags()
    docs = documents(folders - {"docs"})
    tabled = set()
    problems = [p for doc in docs for p in check(doc, folders, flags, tabled)]
    problems += [f"examples/train_gpt.cpp: {flag} has no row in the flag table of docs/train_gpt.md"
                 for flag in sorted(flags - tabled - {"--help", "-h"})]
    problems += header_examples()
    for p in problems:
        print(f"check_docs: {p}")
    print(f"check_docs: {len(docs)} documents, {len(flags)} train_gpt flags, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
