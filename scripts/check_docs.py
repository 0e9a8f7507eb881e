#!/usr/bin/env python3
"""Checks that every repository path the Markdown files name exists, so the docs cannot drift from the tree.

    scripts/check_docs.py            # README.md and docs/*.md; exit 1 naming each missing path (file:line)

A path is a backticked token with a slash whose first folder is one of the repository's (core/, train/, scripts/,
...), without placeholders (<...>, *, DIR, N, ...). A token that names a symbol after the path
(`train/step.h: train_step`) is cut at the first space or colon.
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLACEHOLDER = re.compile(r"[<>*{}$]|\.\.\.|…|\bDIR\b|\bFILE\b|\bN\b|XXXX|step-0")


def main():
    folders = {d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d)) and not d.startswith(".")}
    folders -= {"build", "build-asan", "build-bundle", "build-install"}
    docs = [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
    missing = []
    for doc in docs:
        for number, line in enumerate(open(doc, encoding="utf-8"), 1):
            for token in re.findall(r"`([^`]+)`", line):
                path = re.split(r"[ :(,]", token.strip())[0].rstrip(".")
                if "/" not in path or PLACEHOLDER.search(path) or path.split("/")[0] not in folders:
                    continue
                if not os.path.exists(os.path.join(ROOT, path)):
                    missing.append(f"{os.path.relpath(doc, ROOT)}:{number}: {path}")
    for m in missing:
        print(f"check_docs: no such path: {m}")
    print(f"check_docs: {len(docs)} documents, {len(missing)} missing path(s)")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
