#!/usr/bin/env python3
"""The Hugging Face tokenizers peer of bottle's tokenizer benchmark: how fast one thread of the
`tokenizers` library encodes a text with a tokenizer.json.

    .venv/bin/python tools/hf_tokenize_peer.py --tokenizer tokenizer.json --input FILE \\
        [--documents file|lines|jsonl] [--text-field text] [--repeat N]

The file's bytes are decoded as bottle does (invalid UTF-8 replaced, as Python's 'replace'),
then split into documents: `file` one document, `lines` one per line (its "\\n" dropped, empty
lines skipped), `jsonl` the string field --text-field of each line's object (blank lines
skipped). A special token's string in a document is text (as bottle encodes a corpus). Each
document is encoded on its own with Tokenizer.encode (not encode_batch, which
would use a thread pool), without the post-processor's special tokens, on one thread: the
tokenizers library's Rayon pool is off. The time of the best of --repeat runs over all the
documents is printed as one JSON line:

    {"mb_per_s": ..., "tokens": ..., "bytes": ..., "seconds": ..., ...}

where bytes is the UTF-8 size of the documents and MB is 10^6 bytes. Reading, decoding and
splitting the file are not timed. The Python of the repository's .venv has tokenizers
(scripts/setup.sh).
"""
import os

# Before tokenizers is imported: its Rayon pool reads these once.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["RAYON_RS_NUM_CPUS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

try:
    import tokenizers  # noqa: E402
except ImportError as e:
    sys.exit(f"hf_tokenize_peer: {e}: run scripts/setup.sh (it creates .venv with tokenizers) "
             f"and use .venv/bin/python")


def documents(text, mode, field):
    if mode == "file":
        return [text]
    if mode == "lines":
        return [line for line in text.split("\n") if line]
    docs = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)[field]
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"hf_tokenize_peer: line {number}: no string field {field!r} ({e})")
        if not isinstance(value, str):
            sys.exit(f"hf_tokenize_peer: line {number}: field {field!r} is not a string")
        docs.append(value)
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    ap.add_argument("--input", required=True, help="the text to encode")
    ap.add_argument("--documents", choices=("file", "lines", "jsonl"), default="file",
                    help="how the text splits into documents (default file: one)")
    ap.add_argument("--text-field", default="text", help="the field of --documents jsonl")
    ap.add_argument("--repeat", type=int, default=3, help="runs, the best one counts (default 3)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    tok = tokenizers.Tokenizer.from_file(args.tokenizer)
    # A special token's string in a document is text, as bottle encodes a corpus.
    tok.encode_special_tokens = True
    with open(args.input, "rb") as f:
        text = f.read().decode("utf-8", "replace")
    docs = documents(text, args.documents, args.text_field)
    size = sum(len(d.encode("utf-8")) for d in docs)

    best = None
    tokens = 0
    for _ in range(args.repeat):
        count = 0
        start = time.perf_counter()
        for doc in docs:
            count += len(tok.encode(doc, add_special_tokens=False).ids)
        seconds = time.perf_counter() - start
        tokens = count
        best = seconds if best is None else min(best, seconds)
    print(json.dumps({
        "mb_per_s": size / 1e6 / best if best > 0 else None,
        "tokens": tokens,
        "bytes": size,
        "seconds": best,
        "documents": len(docs),
        "repeat": args.repeat,
        "threads": 1,
        "tokenizers": tokenizers.__version__,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
