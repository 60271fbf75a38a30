#!/usr/bin/env python3
"""Trains a byte-level BPE tokenizer.json (GPT-2 style) with the Hugging Face tokenizers library,
for `bottle prepare --tokenizer`. bottle reads tokenizers, it does not train them; this is the
one step of the BPE example in the README that needs Python (the .venv of scripts/setup.sh).

    .venv/bin/python tools/train_tokenizer.py --vocab 4096 --out DIR FILES...

writes DIR/tokenizer.json: ByteLevel pre-tokenizer (GPT-2's split regex) and decoder, BPE with
the 256 byte symbols, merges learnt on FILES up to --vocab tokens, and <|endoftext|> as its one
special token (the document delimiter bottle places before each document).
"""
import argparse
import os
import sys

try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError as e:
    sys.exit(f"train_tokenizer: {e}: run scripts/setup.sh and use .venv/bin/python")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", help="text files to learn the merges from")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (>= 257)")
    parser.add_argument("--out", required=True, help="directory for tokenizer.json")
    args = parser.parse_args()
    if args.vocab < 257:
        sys.exit("train_tokenizer: --vocab must be at least 257 (256 bytes + <|endoftext|>)")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=args.vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def lines():
        for path in args.files:
            with open(path, "rb") as f:
                yield from f.read().decode("utf-8", "replace").splitlines(keepends=True)

    tokenizer.train_from_iterator(lines(), trainer=trainer)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tokenizer.json")
    tokenizer.save(path)
    print(f"wrote {path} (vocabulary {tokenizer.get_vocab_size()})")


if __name__ == "__main__":
    main()
