#!/usr/bin/python3
"""Load a minidl GPT checkpoint into PyTorch and measure its validation loss: the proof that a PyTorch user can
use what minidl trained.

    /usr/bin/python3 scripts/load_in_pytorch.py out/model.safetensors \
        --data data/tinyshakespeare.txt --seq 256 --windows 64
    -> val_loss=1.4821

The checkpoint is read with struct/json/numpy (no safetensors package needed); --transformers evaluates it with
Hugging Face's GPT2LMHeadModel (or LlamaForCausalLM, for a minidl Llama) instead (the file must be
model.safetensors, beside minidl's config.json). The model is a small nanoGPT-style
GPT-2 whose parameter names are Hugging Face's (transformer.h.0.attn.c_attn.weight, ...) and whose linear weights
use HF's Conv1D layout (in, out): y = x @ W + b. The output head is tied to transformer.wte.weight.

Validation data: the last 10% of the corpus bytes (from byte n * 9 // 10, as minidl's dataset splits 90/10),
tokenized with the vocabulary stored in the checkpoint's metadata (a model trained with --tokenizer gpt2: the text
after its first 90% of characters, encoded by tiktoken), cut into the first K non-overlapping windows of seq + 1
tokens; each window predicts tokens 1..seq from 0..seq-1. Prints the mean loss over the windows.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---- safetensors ----

_NUMPY_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8", "U8": "u1"}


def read_safetensors(path):
    """Returns ({name: torch.Tensor}, metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        sys.exit(f"{path}: file too short ({len(blob)} bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if 8 + n > len(blob):
        sys.exit(f"{path}: header length {n} runs past the end of the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[begin:end]
        if info["dtype"] == "BF16":  # numpy has no bfloat16: widen the 16 bits into the top of a float32
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            array = bits.view(np.float32)
        elif info["dtype"] in _NUMPY_DTYPES:
            array = np.frombuffer(raw, dtype=_NUMPY_DTYPES[info["dtype"]])
        else:
            sys.exit(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        tensors[name] = torch.from_numpy(array.astype(np.float32).reshape(info["shape"]))
    return tensors, metadata


# ---- GPT-2 with Hugging Face names ----


class Conv1D(nn.Module):
    """HF GPT-2's linear layer: weight (in, out), y = x @ W + b."""

    def __init__(self, n_in, n_out, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out)) if bias else None

    def forward(self, x):
        y = x @ self.weight
        return y + self.bias if self.bias is not None else y


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg["n_head"]
        self.c_attn = Conv1D(cfg["n_embd"], 3 * cfg["n_embd"], cfg["bias"])
        self.c_proj = Conv1D(cfg["n_embd"], cfg["n_embd"], cfg["bias"])

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.n_head)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg["n_embd"], 4 * cfg["n_embd"], cfg["bias"])
        self.c_proj = Conv1D(4 * cfg["n_embd"], cfg["n_embd"], cfg["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.attn = Attention(cfg)
        self.ln_2 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg["vocab_size"], cfg["n_embd"]),
            wpe=nn.Embedding(cfg["block_size"], cfg["n_embd"]),
            h=nn.ModuleList(Block(cfg) for _ in range(cfg["n_layer"])),
            ln_f=LayerNorm(cfg["n_embd"], cfg["bias"]),
        ))

    def forward(self, ids):
        t = self.transformer
        x = t.wte(ids) + t.wpe(torch.arange(ids.shape[1]))
        for block in t.h:
            x = block(x)
        return t.ln_f(x) @ t.wte.weight.T  # tied head


# ---- data ----


def vocabulary_bytes(vocab):
    """The checkpoint's vocabulary as a list of byte values, token id = position. minidl's CharTokenizer writes
    {"type": "char", "vocab": [10, 32, ...]}; a bare list of byte values or one-character strings, or a string of
    characters, is accepted too."""
    if isinstance(vocab, dict):
        vocab = vocab.get("tokens", vocab.get("vocab"))
    if isinstance(vocab, str):
        vocab = list(vocab)
    out = []
    for tok in vocab or []:
        if isinstance(tok, int) and 0 <= tok < 256:
            out.append(tok)
        elif isinstance(tok, str) and len(tok) == 1 and ord(tok) < 256:
            out.append(ord(tok))
        else:
            sys.exit(f"vocabulary entry {tok!r} is not a byte (expected an int 0..255 or a one-character string)")
    if not out:
        sys.exit("the checkpoint's vocabulary is empty or in an unknown form")
    return out


def gpt2_validation_tokens(path, encoding_file):
    """GPT-2's ids of the validation split, as minidl's TextDataset makes them: the text after its first 90% of
    characters, encoded alone, by tiktoken (the real client) from the encoding file."""
    import base64

    import tiktoken
    with open(encoding_file) as f:
        ranks = {base64.b64decode(tok): int(rank) for tok, rank in (line.split() for line in f if line.strip())}
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    enc = tiktoken.Encoding("gpt2-offline", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 50256})
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    return np.array(enc.encode_ordinary(text[len(text) * 9 // 10:]), dtype=np.int64)


def char_validation_tokens(path, vocab):
    """The last 10% of the corpus bytes through the checkpoint's character vocabulary."""
    with open(path, "rb") as f:
        corpus = f.read()
    val = corpus[len(corpus) * 9 // 10:]
    lookup = np.full(256, -1, dtype=np.int64)
    lookup[np.array(vocab)] = np.arange(len(vocab))
    tokens = lookup[np.frombuffer(val, dtype=np.uint8)]
    if (tokens < 0).any():
        bad = val[int(np.argmax(tokens < 0))]
        sys.exit(f"{path}: byte {bad!r} of the validation split is not in the checkpoint's vocabulary")
    return tokens


def validation_windows(path, tokens, seq, windows):
    available = len(tokens) // (seq + 1)
    if windows > available:
        sys.exit(f"{path}: asked for {windows} windows of {seq + 1} tokens, the validation split holds {available}")
    return torch.from_numpy(tokens[: windows * (seq + 1)].reshape(windows, seq + 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="a .safetensors file written by minidl (nn::save_gpt)")
    ap.add_argument("--data", required=True, help="the text corpus the model was trained on")
    ap.add_argument("--seq", type=int, required=True, help="tokens per window (at most the model's block_size)")
    ap.add_argument("--windows", type=int, required=True, help="number of validation windows to average over")
    ap.add_argument("--batch", type=int, default=16, help="windows per forward pass")
    ap.add_argument("--gpt2-encoding", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                                                            "gpt2.tiktoken"),
                    help="GPT-2's encoding file, for a checkpoint trained with --tokenizer gpt2 (needs tiktoken)")
    ap.add_argument("--transformers", action="store_true",
                    help="evaluate with transformers' GPT2LMHeadModel (from the file's folder) instead of this file's "
                         "own PyTorch GPT")
    args = ap.parse_args()

    tensors, metadata = read_safetensors(args.checkpoint)
    if "config" not in metadata or "vocab" not in metadata:
        sys.exit(f"{args.checkpoint}: no config/vocab in __metadata__; was it written by minidl's save_gpt?")
    cfg = json.loads(metadata["config"])
    if args.seq > cfg["block_size"]:
        sys.exit(f"--seq {args.seq} exceeds the model's block_size {cfg['block_size']}")
    if args.transformers:
        # Hugging Face's own GPT-2 reads the folder: config.json (written beside the file) and model.safetensors.
        from transformers import GPT2LMHeadModel, LlamaForCausalLM
        folder = os.path.dirname(os.path.abspath(args.checkpoint))
        if os.path.basename(args.checkpoint) != "model.safetensors":
            sys.exit(f"--transformers: expected a file named model.safetensors (transformers reads that name), got "
                     f"{args.checkpoint}")
        llama = cfg.get("arch") == "llama"
        hf = (LlamaForCausalLM if llama else GPT2LMHeadModel).from_pretrained(folder)
        model = lambda ids: hf(ids).logits  # noqa: E731
        hf.eval()
        parameters = sum(p.numel() for p in hf.parameters())
    elif cfg.get("arch") == "llama":
        sys.exit(f"{args.checkpoint}: a Llama (HF's names and layout); evaluate it with --transformers")
    else:
        gpt = GPT(cfg)
        gpt.load_state_dict(tensors, strict=True)
        gpt.eval()
        model, parameters = gpt, sum(p.numel() for p in gpt.parameters())
    print(f"loaded {args.checkpoint}{' with transformers' if args.transformers else ''}: {parameters} parameters, "
          f"config {cfg}", file=sys.stderr)

    vocab = json.loads(metadata["vocab"])
    if isinstance(vocab, dict) and vocab.get("type") == "gpt2":
        tokens = gpt2_validation_tokens(args.data, args.gpt2_encoding)
    else:
        tokens = char_validation_tokens(args.data, vocabulary_bytes(vocab))
    data = validation_windows(args.data, tokens, args.seq, args.windows)
    total = 0.0
    with torch.no_grad():
        for chunk in data.split(args.batch):
            logits = model(chunk[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), chunk[:, 1:].reshape(-1), reduction="none")
            total += loss.view(len(chunk), -1).mean(dim=1).sum().item()
    print(f"val_loss={total / args.windows:.9g}")


if __name__ == "__main__":
    main()
