"""The oracle of tests/data/test_bpe_tokenizer.cpp and of train_gpt's tokenizer.json tests: Hugging Face's
`tokenizers` (the library that writes and reads tokenizer.json) makes the files and gives their ids.

  hf_tokenizer_oracle.py make DIR CORPUS      trains byte-level BPEs on CORPUS and writes, in DIR:
      gpt2style.json   ByteLevel pre-tokenizer (GPT-2's regex), 2,048 ids, 3 added tokens (SmolLM's layout)
      prefix.json      the same with add_prefix_space
      llama3style.json Split by Llama 3's regex, then ByteLevel without its own, 3,000 ids, 2 added tokens
      pairs.json       gpt2style.json with its merges as pairs ["a", "b"] (what tokenizers >= 0.20 writes)
  hf_tokenizer_oracle.py encode JSON TEXT    prints tokenizers' ids of the file TEXT, add_special_tokens=False
  hf_tokenizer_oracle.py resave SRC DST      a Llama folder through transformers' from_pretrained/save_pretrained
                                             (no minidl metadata), with SRC's tokenizer.json copied beside it
"""
import json
import os
import shutil
import sys

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train(corpus, vocab_size, specials, pre):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([corpus], trainer)
    return tok


def make(out, corpus):
    os.makedirs(out, exist_ok=True)
    gpt2 = train(corpus, 2048, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                 pre_tokenizers.ByteLevel(add_prefix_space=False))
    gpt2.save(os.path.join(out, "gpt2style.json"))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    gpt2.save(os.path.join(out, "prefix.json"))
    llama3 = train(corpus, 3000, ["<|begin_of_text|>", "<|end_of_text|>"], pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]))
    llama3.save(os.path.join(out, "llama3style.json"))
    with open(os.path.join(out, "gpt2style.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["model"]["merges"] = [m.split(" ", 1) for m in doc["model"]["merges"]]
    with open(os.path.join(out, "pairs.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False)


def encode(path, text_file):
    tok = Tokenizer.from_file(path)
    with open(text_file, encoding="utf-8", newline="") as f:  # the bytes as they are: no \r\n to \n
        text = f.read()
    print(" ".join(map(str, tok.encode(text, add_special_tokens=False).ids)))


def resave(src, dst):
    from transformers import LlamaForCausalLM
    LlamaForCausalLM.from_pretrained(src).save_pretrained(dst, safe_serialization=True)
    shutil.copy(os.path.join(src, "tokenizer.json"), os.path.join(dst, "tokenizer.json"))


if __name__ == "__main__":
    commands = {"make": make, "encode": encode, "resave": resave}
    if len(sys.argv) != 4 or sys.argv[1] not in commands:
        sys.exit(__doc__)
    commands[sys.argv[1]](sys.argv[2], sys.argv[3])
