#!/usr/bin/python3
"""The oracle of tests/data/test_gpt2_tokenizer.cpp: tiktoken's GPT-2 ids for a text file, from the same encoding
file, offline (the ranks read here, not downloaded). Prints the ids on one line, separated by spaces.

    python tiktoken_ids.py data/gpt2.tiktoken TEXT_FILE
"""
import base64
import sys

import tiktoken

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def encoding(path):
    """tiktoken's GPT-2 Encoding from the encoding file at `path` (bench/tokenizer.cpp uses it too)."""
    with open(path) as f:
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
    return tiktoken.Encoding("gpt2-offline", pat_str=PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": 50256})


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tiktoken_ids.py ENCODING_FILE TEXT_FILE")
    enc = encoding(sys.argv[1])
    with open(sys.argv[2], encoding="utf-8", newline="") as f:  # the bytes as they are: no newline translation
        text = f.read()
    print(" ".join(str(i) for i in enc.encode_ordinary(text)))


if __name__ == "__main__":
    main()
