#!/usr/bin/env python3
"""bottle's tokenizers against their reference libraries, id for id and byte for byte.

Run by ctest (test tokenizers_exact) with the Python of the repository's .venv, which
scripts/setup.sh creates with pinned tokenizers, sentencepiece and tiktoken:

    .venv/bin/python tests/data/tokenizer_oracle.py --bottle build/bottle --work /tmp/tok
    .venv/bin/python tests/data/tokenizer_oracle.py --make-only --work /tmp/tok --bpe-vocab 4096

It trains small tokenizers at test time on the fortunes files (Debian's package fortunes), one
of each kind bottle reads, and writes them into --work:

    sp_bpe/tokenizer.model           SentencePiece BPE, LLaMA-2's trainer settings (byte fallback,
                                     identity normalization, digits split), vocab 1000
    sp_unigram/tokenizer.model       SentencePiece unigram, default settings (NFKC, extra
                                     whitespace removed, no byte fallback: <unk>), vocab 1000
    gpt2_bpe/tokenizer.json          HF byte-level BPE as GPT-2's: ByteLevel pre-tokenizer with
                                     its regex, <|endoftext|> at id 0, vocab --bpe-vocab
    llama2_bpe/tokenizer.json        HF BPE laid out as HF's LlamaConverter writes LLaMA-2's:
                                     Prepend/Replace "▁" normalizer, byte fallback, <unk> <s>
                                     </s> at 0..2, <0x00>..<0xFF> at 3..258, vocab 1500
    llama3_bpe/tokenizer.json        HF byte-level BPE as LLaMA-3's: Split(LLaMA-3 regex) then
                                     ByteLevel without regex, ignore_merges, special tokens
                                     after the vocabulary, vocab --bpe-vocab + 2
    tiktoken_gpt2/tokenizer.tiktoken gpt2_bpe's vocabulary as a tiktoken rank file (pattern
                                     r50k_base, <|endoftext|>=0)
    tiktoken_llama3/tokenizer.tiktoken  llama3_bpe's, with the LLaMA-3 regex given as the pattern
    test_text.txt                    tests/fixtures/tokenizer_test_text.txt and invalid UTF-8 bytes

Then, for each tokenizer and each text (the test text, each of its paragraphs, edge cases, every
fifth fortune), `bottle tokenize` must give exactly the library's ids; bottle's decode of the
library's ids (of those texts but the paragraphs, of every id in order, of random ids, of byte
tokens that make invalid UTF-8) must be the library's decode; and where the tokenizer is
lossless the library's decode(encode(x)) must be x, so bottle's is too. bottle replaces invalid
UTF-8 as Python's bytes.decode('utf-8', 'replace') does, so the library encodes that string.
Special tokens' strings inside a text are ordinary text (what a corpus must get): tiktoken's
encode_ordinary, and for tokenizers encode_special_tokens = True.
"""
import argparse
import base64
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# Single-threaded tokenizers: deterministic, and no warning when subprocesses are forked.
os.environ["TOKENIZERS_PARALLELISM"] = "false"
# tiktoken caches a rank file it loads by the hash of its *path* (in /tmp/data-gym-cache):
# a file rewritten at the same path would be read back stale. "" turns the cache off.
os.environ["TIKTOKEN_CACHE_DIR"] = ""

try:
    import sentencepiece as spm
    import tiktoken
    import tiktoken.load
    import tokenizers
    from tokenizers import (Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers,
                            processors, trainers)
except ImportError as e:  # a failure, never a skip: the comparison must run
    sys.exit(f"tokenizer_oracle: FAIL: {e}. The oracle's Python packages are missing: run "
             f"scripts/setup.sh (it creates .venv with them) and use .venv/bin/python.")

SOURCE_DIR = Path(__file__).resolve().parents[2]
TEST_TEXT = SOURCE_DIR / "tests" / "fixtures" / "tokenizer_test_text.txt"
FORTUNES = Path("/usr/share/games/fortunes")

# Invalid UTF-8 appended to the committed (valid) test text: a byte never in UTF-8, an overlong
# "/", a UTF-16 surrogate, a lone continuation byte, a code point past U+10FFFF, an overlong
# 3-byte NUL, a truncated 4-byte sequence before a space, and a truncated "€" at the very end.
INVALID_TAIL = (b"\n\nInvalid UTF-8: \xff ok \xc0\xaf overlong, \xed\xa0\x80 surrogate, "
                b"\x80 lone, \xf4\x90\x80\x80 too big, \xe0\x80\x80 overlong3, "
                b"\xf0\x9f\x98 truncated, end:\xe2\x82")

# GPT-2's split pattern as tiktoken's r50k_base has it (possessive quantifiers, "\s++$"; the
# same splits as the ByteLevel pre-tokenizer's regex). Checked against tiktoken's in main().
R50K_PATTERN = (r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|"""
                r"""\s+(?!\S)|\s""")
# LLaMA-3's pre-tokenizer regex, as its tokenizer.json has it. cl100k_base's differs: it has
# "'(?i:[sdmt]|ll|ve|re)", possessive quantifiers and "\s*[\r\n]" for "\s*[\r\n]+".
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# SentencePiece's whitespace marker, U+2581.
SPACE_MARK = "\u2581"

# Vocabulary sizes (the byte-level ones are --bpe-vocab). The unigram trainer is the slow one
# (~3 s of CPU on 500 kB, ~10 s on the whole 2.5 MB): it trains on the corpus's first 500 kB.
SP_VOCAB = 1000
LLAMA2_VOCAB = 1500
UNIGRAM_CORPUS_BYTES = 500_000


def log(msg):
    print(msg, flush=True)


# ---------------------------------------------------------------------------------------------
# Training.


def write_corpus(work):
    files = sorted(p for p in FORTUNES.iterdir()
                   if p.is_file() and p.suffix not in (".dat", ".u8"))
    if not files:
        sys.exit(f"tokenizer_oracle: FAIL: no fortunes files in {FORTUNES}: run scripts/setup.sh "
                 f"(Debian's package fortunes)")
    corpus = b"".join(p.read_bytes() for p in files)
    path = work / "corpus.txt"
    path.write_bytes(corpus)
    cut = corpus.rfind(b"\n", 0, UNIGRAM_CORPUS_BYTES) + 1
    small = work / "corpus_500k.txt"
    small.write_bytes(corpus[:cut])
    return path, small


def train_sentencepiece(work, corpus, small_corpus):
    spm.set_random_generator_seed(1234)
    common = dict(vocab_size=SP_VOCAB, num_threads=1, shuffle_input_sentence=False,
                  input_sentence_size=0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    # The trainer's log goes to logstream, which it closes after (so one each).
    (work / "sp_bpe").mkdir(exist_ok=True)
    # LLaMA-2's settings: byte fallback, no normalization, whitespace kept as it is, digits one
    # by one, pieces of whitespace only.
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(work / "sp_bpe" / "tokenizer"), model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.99995, logstream=open(os.devnull, "w"), **common)
    (work / "sp_unigram").mkdir(exist_ok=True)
    # SentencePiece's defaults: nmt_nfkc, extra whitespace removed, unknown characters <unk>.
    spm.SentencePieceTrainer.train(
        input=str(small_corpus), model_prefix=str(work / "sp_unigram" / "tokenizer"),
        model_type="unigram", byte_fallback=False, logstream=open(os.devnull, "w"), **common)


def bytes_to_unicode():
    """GPT-2's byte ⇄ printable-character table of the byte-level BPE (character → byte)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def train_gpt2_bpe(work, corpus, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    tok.train([str(corpus)], trainer)
    (work / "gpt2_bpe").mkdir(exist_ok=True)
    tok.save(str(work / "gpt2_bpe" / "tokenizer.json"))


def train_llama3_bpe(work, corpus, vocab):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(corpus)], trainer)
    # As LLaMA-3: the special tokens after the vocabulary, BOS added by the post-processor
    # (never here: the oracle encodes with add_special_tokens=False).
    tok.add_special_tokens(["<|begin_of_text|>", "<|end_of_text|>"])
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(
            single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|>:1 $B:1",
            special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])])
    data = json.loads(tok.to_str())
    if data["model"].get("ignore_merges") is not True:
        sys.exit("tokenizer_oracle: FAIL (oracle): the trained LLaMA-3-style model lost "
                 "ignore_merges")
    (work / "llama3_bpe").mkdir(exist_ok=True)
    tok.save(str(work / "llama3_bpe" / "tokenizer.json"))


def train_llama2_bpe(work, corpus):
    """A tokenizer.json laid out as HF's LlamaConverter writes LLaMA-2's (the file on the Hub):
    <unk> <s> </s> at 0..2, the byte tokens <0x00>..<0xFF> at 3..258, then the pieces; the
    normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer (the whole text is one word),
    byte fallback, the decoder Replace("▁", " ") ByteFallback Fuse Strip(" ", 1, 0), merges as
    "left right" strings (the older format, as that file has them)."""
    specials = ["<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE_MARK),
                                           normalizers.Replace(" ", SPACE_MARK)])
    # For training only: words that start at "▁", so that pieces never span a space inside
    # them, as SentencePiece's. The saved tokenizer has no pre-tokenizer, as LLaMA-2's.
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE_MARK, prepend_scheme="never",
                                                 split=True)
    trainer = trainers.BpeTrainer(vocab_size=LLAMA2_VOCAB - 256, show_progress=False,
                                  special_tokens=specials)
    tok.train([str(corpus)], trainer)
    data = json.loads(tok.to_str())
    model = data["model"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1]):
        if piece in specials:
            continue
        if piece in vocab:
            sys.exit(f"tokenizer_oracle: FAIL (oracle): trained piece {piece!r} is a byte token")
        vocab[piece] = len(vocab)
    model["vocab"] = vocab
    model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    if any(len(m.split(" ")) != 2 for m in model["merges"]):
        sys.exit("tokenizer_oracle: FAIL (oracle): a LLaMA-2-style merge holds a space")
    data["pre_tokenizer"] = None
    data["decoder"] = json.loads(decoders.Sequence([
        decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0)]).__getstate__())
    data["post_processor"] = json.loads(processors.TemplateProcessing(
        single="<s>:0 $A:0", pair="<s>:0 $A:0 <s>:1 $B:1",
        special_tokens=[("<s>", 1)]).__getstate__())
    for added in data["added_tokens"]:
        if added["id"] != vocab[added["content"]]:
            sys.exit(f"tokenizer_oracle: FAIL (oracle): special token {added} moved")
    (work / "llama2_bpe").mkdir(exist_ok=True)
    path = work / "llama2_bpe" / "tokenizer.json"
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    Tokenizer.from_file(str(path))  # HF reads it back


def write_tiktoken(work, name, json_path):
    """The byte-level vocabulary of json_path as a tiktoken rank file: each token's bytes and
    its id as the rank, special tokens left out, one "BASE64 RANK" line each in rank order (what
    tiktoken.load.load_tiktoken_bpe reads). Returns the ranks and the special tokens."""
    tok = Tokenizer.from_file(str(json_path))
    char_to_byte = bytes_to_unicode()
    specials = {a.content: i for i, a in tok.get_added_tokens_decoder().items() if a.special}
    ranks = {}
    for token, i in tok.get_vocab(with_added_tokens=False).items():
        if token in specials:
            continue
        ranks[bytes(char_to_byte[c] for c in token)] = i
    if len(ranks) != len(set(ranks.values())):
        sys.exit(f"tokenizer_oracle: FAIL (oracle): {json_path} maps two tokens to one rank")
    (work / name).mkdir(exist_ok=True)
    path = work / name / "tokenizer.tiktoken"
    with open(path, "w", encoding="ascii") as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    if tiktoken.load.load_tiktoken_bpe(str(path)) != ranks:
        sys.exit(f"tokenizer_oracle: FAIL (oracle): tiktoken reads {path} back differently")
    return ranks, specials


def make_all(work, bpe_vocab):
    """Trains and writes every tokenizer and the test text into work; returns the test text."""
    work.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    corpus, small_corpus = write_corpus(work)
    train_sentencepiece(work, corpus, small_corpus)
    train_gpt2_bpe(work, corpus, bpe_vocab)
    train_llama3_bpe(work, corpus, bpe_vocab)
    train_llama2_bpe(work, corpus)
    raw = read_test_text()
    (work / "test_text.txt").write_bytes(raw)
    log(f"trained the tokenizers into {work} in {time.monotonic() - start:.1f} s")
    return raw


def read_test_text():
    text = TEST_TEXT.read_bytes()
    # The committed file must have kept its bytes (an editor or a line-ending conversion would
    # quietly weaken the test).
    for needle in (b"\r\n", b"\t\t", b"   \n", b"\n\n\n\n", b"e\xcc\x81", b"\xe2\x80\x8d",
                   b"1234567890123456789012345678901234567890"):
        if needle not in text:
            sys.exit(f"tokenizer_oracle: FAIL: {TEST_TEXT} lost {needle!r}")
    return text + INVALID_TAIL


# ---------------------------------------------------------------------------------------------
# The reference libraries behind one interface.


class SentencePieceLib:
    kind = "sentencepiece"

    def __init__(self, path):
        self.sp = spm.SentencePieceProcessor(model_file=str(path))
        self.vocab = self.sp.get_piece_size()

    def encode(self, text):
        return self.sp.encode(text)  # no BOS / EOS

    def decode(self, ids):
        return self.sp.decode(ids)

    def piece(self, i):
        return self.sp.id_to_piece(i) if 0 <= i < self.vocab else f"<bad id {i}>"

    def byte_ids(self, data):
        """Ids of the byte pieces <0xXX>, or None without byte fallback."""
        ids = [self.sp.piece_to_id(f"<0x{b:02X}>") for b in data]
        return None if any(self.sp.is_unknown(i) for i in ids) else ids


class TokenizersLib:
    kind = "tokenizer.json"

    def __init__(self, path, byte_level):
        self.tok = Tokenizer.from_file(str(path))
        # A special token's string inside a text is text (bottle's contract, tiktoken's
        # encode_ordinary); tokenizers would otherwise match it even with
        # add_special_tokens=False, which only turns the post-processor off.
        self.tok.encode_special_tokens = True
        self.vocab = self.tok.get_vocab_size(with_added_tokens=True)
        self.byte_level = byte_level
        self.byte_to_char = {b: c for c, b in bytes_to_unicode().items()}

    def encode(self, text):
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)

    def piece(self, i):
        p = self.tok.id_to_token(i)
        return p if p is not None else f"<bad id {i}>"

    def byte_ids(self, data):
        if self.byte_level:
            return [self.tok.token_to_id(self.byte_to_char[b]) for b in data]
        return [self.tok.token_to_id(f"<0x{b:02X}>") for b in data]


class TiktokenLib:
    kind = "tiktoken"

    def __init__(self, ranks, pattern, specials):
        self.enc = tiktoken.Encoding(name="bottle_test", pat_str=pattern, mergeable_ranks=ranks,
                                     special_tokens=specials)
        self.vocab = self.enc.max_token_value + 1
        self.ranks = ranks

    def encode(self, text):
        return self.enc.encode_ordinary(text)

    def decode(self, ids):
        return self.enc.decode(ids)  # errors="replace"

    def piece(self, i):
        try:
            return self.enc.decode_single_token_bytes(i)
        except KeyError:
            return f"<bad id {i}>"

    def byte_ids(self, data):
        return [self.ranks[bytes([b])] for b in data]


class Case:
    """One tokenizer under test: its file, how bottle is told to read it, the library."""

    def __init__(self, name, path, lib, lossless, bottle_args=()):
        self.name = name
        self.path = path
        self.lib = lib
        self.lossless = lossless  # text -> whether decode(encode(text)) must be text
        self.bottle_args = list(bottle_args)


def load_cases(work):
    ranks_gpt2, specials_gpt2 = write_tiktoken(work, "tiktoken_gpt2",
                                               work / "gpt2_bpe" / "tokenizer.json")
    ranks_llama3, specials_llama3 = write_tiktoken(work, "tiktoken_llama3",
                                                   work / "llama3_bpe" / "tokenizer.json")

    def always(_):
        return True

    def never(_):
        return False

    def without_space_mark(text):
        return SPACE_MARK not in text

    def special_args(specials):
        return [a for s, i in specials.items() for a in ("--tiktoken-special", f"{s}={i}")]

    return [
        # Byte fallback, identity normalization and whitespace kept as it is: every text comes
        # back, the dummy prefix "▁" dropped again by the decoder; except a "▁" (U+2581) in the
        # text itself, SentencePiece's own mark for a space, which decodes as " ".
        Case("sp_bpe", work / "sp_bpe" / "tokenizer.model",
             SentencePieceLib(work / "sp_bpe" / "tokenizer.model"), without_space_mark),
        # NFKC, runs of whitespace collapsed and characters outside the vocabulary as <unk>
        # (" ⁇ "): lossy, compared id for id and decode for decode only.
        Case("sp_unigram", work / "sp_unigram" / "tokenizer.model",
             SentencePieceLib(work / "sp_unigram" / "tokenizer.model"), never),
        # Byte-level: every byte has a token, no normalizer: lossless.
        Case("gpt2_bpe", work / "gpt2_bpe" / "tokenizer.json",
             TokenizersLib(work / "gpt2_bpe" / "tokenizer.json", True), always),
        # Byte fallback covers every character; the "▁" prepended is stripped by the decoder.
        # Lossy only for a "▁" in the text (decoded as " "), as the sp_bpe.
        Case("llama2_bpe", work / "llama2_bpe" / "tokenizer.json",
             TokenizersLib(work / "llama2_bpe" / "tokenizer.json", False), without_space_mark),
        Case("llama3_bpe", work / "llama3_bpe" / "tokenizer.json",
             TokenizersLib(work / "llama3_bpe" / "tokenizer.json", True), always),
        # tiktoken: bytes in, bytes out: lossless.
        Case("tiktoken_gpt2", work / "tiktoken_gpt2" / "tokenizer.tiktoken",
             TiktokenLib(ranks_gpt2, R50K_PATTERN, specials_gpt2), always,
             ["--tiktoken-pattern", "r50k_base"] + special_args(specials_gpt2)),
        # The pattern given as a regex, the special tokens after the last rank.
        Case("tiktoken_llama3", work / "tiktoken_llama3" / "tokenizer.tiktoken",
             TiktokenLib(ranks_llama3, LLAMA3_PATTERN, specials_llama3), always,
             ["--tiktoken-pattern", LLAMA3_PATTERN] + special_args(specials_llama3)),
    ]


def references(cases, texts):
    """The library's ids and decode of every text, by (tokenizer, text). Oracle failures: a
    text the test calls lossless that the library's own round trip changes."""
    refs = {}
    failures = {c.name: 0 for c in cases}
    for case in cases:
        for name, raw in texts:
            text = raw.decode("utf-8", "replace")  # what bottle does to invalid UTF-8
            ids = case.lib.encode(text)
            decoded = case.lib.decode(ids).encode("utf-8")
            if case.lossless(text) and decoded != text.encode("utf-8"):
                failures[case.name] += 1
                log(f"FAIL (oracle): {case.name}: the library's decode(encode({name})) is not "
                    f"the text, which the test calls lossless")
                report_bytes(text.encode("utf-8"), decoded, "round trip", "text", "decoded")
            refs[case.name, name] = (ids, decoded)
    return refs, failures


def check_tiktoken_agrees(refs, texts):
    """tiktoken's merge-by-rank on the rank files must reproduce tokenizers' merges on every
    text (the id of a merge's result is its place in the merges): else a rank file is not the
    same tokenizer as its tokenizer.json, and the two would be oracles of different things."""
    ok = True
    for hf, tt in (("gpt2_bpe", "tiktoken_gpt2"), ("llama3_bpe", "tiktoken_llama3")):
        for name, _ in texts:
            a, b = refs[hf, name][0], refs[tt, name][0]
            if a != b:
                ok = False
                log(f"FAIL (oracle): tiktoken on {tt} differs from tokenizers' {hf} on {name}")
                report_ids(None, a, b, "tokenizers", "tiktoken")
    return ok


# ---------------------------------------------------------------------------------------------
# Texts.


def make_texts(raw, corpus):
    """(name, bytes) pairs: the test text, each paragraph of it, edge cases, the corpus."""
    texts = [("test_text", raw)]
    decoded = raw.decode("utf-8", "replace")
    for i, para in enumerate(p for p in re.split(r"\n\n+", decoded) if p):
        texts.append((f"paragraph_{i}", para.encode("utf-8")))
    texts += [
        ("empty", b""),
        ("space", b" "),
        ("newline", b"\n"),
        ("hello_leading_2", b"  hello"),
        ("leading_trailing", b"   leading and trailing   "),
        ("trailing_newlines", b"end\n\n"),
        ("spaces_3000", b" " * 3000),
        ("digits_5000", (b"1234567890" * 500)),
        ("word_then_spaces", b"word" + b" " * 100 + b"x"),
        ("newlines_spaces", b"a \n \n\n  \r\n\t b"),
        ("only_invalid", b"\xff\xfe\xc0\xaf\xed\xa0\x80\xe2\x82"),
        ("invalid_mid_word", b"caf\xc3 na\xefve \xe2\x82\xac\xe2\x82"),
        ("controls", b"nul\x00bell\x07esc\x1b[31mdel\x7f\x01\x02\x03\x0b\x0c\x1c\x1d\x1e\x1f"),
        ("bom_and_zero_width", "\ufeffBOM \u200bzero\u200cwidth\u200d joiners\u2060".encode()),
        ("space_mark", "pre\u2581marked \u2581word\u2581\u2581".encode()),
        ("specials_as_text", b"<|endoftext|><s></s><unk><|end_of_text|>x<|endoftext|>"),
        ("long_word", ("supercalifragilistic" * 100).encode()),
        ("astral", "\U0001d400\U0001d401 \U00010348 \U0001f9d1\u200d\U0001f91d\u200d\U0001f9d1"
                   " \U000e0067 \U0010ffff".encode()),
        # Every fifth fortune of every file (~500 kB; the whole corpus triples the time).
        ("fortunes", b"\n%\n".join(corpus.split(b"\n%\n")[::5])),
    ]
    return texts


def decode_only_ids(lib, rng):
    """Id sequences for decode alone: every id in order, a seeded random draw, and byte tokens
    that make invalid UTF-8 (how each library replaces it is part of its decode)."""
    out = [("all_ids", list(range(lib.vocab))),
           ("random_ids", [rng.randrange(lib.vocab) for _ in range(3000)])]
    parts = [b"\xe2\x82", None, b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xff", None,
             b"\xed\xa0\x80", b"\xc3", b"\xe2\x82"]
    if lib.byte_ids(b"a") is not None:
        ids = []
        for part in parts:
            ids += lib.encode(" a b") if part is None else lib.byte_ids(part)
        out.append(("invalid_utf8_bytes", ids))
    return out


# ---------------------------------------------------------------------------------------------
# bottle.


def run_bottle(bottle, case, input_path, decode):
    cmd = [str(bottle), "tokenize", "--tokenizer", str(case.path), *case.bottle_args]
    if decode:
        cmd.append("--decode")
    cmd += ["--input", str(input_path)]
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=300,
                              env={**os.environ, "OMP_NUM_THREADS": "1",
                                   "OMP_WAIT_POLICY": "passive"})
    except subprocess.TimeoutExpired:
        return None, f"timed out after 300 s: {shlex.join(cmd)}"
    except OSError as e:
        return None, f"could not run: {e}"
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        return None, f"exit status {proc.returncode}: {shlex.join(cmd)}\n    {err}"
    if decode:
        return proc.stdout, None
    try:
        ids = json.loads(proc.stdout)
    except ValueError as e:
        return None, f"stdout is not one JSON array ({e}): {proc.stdout[:200]!r}"
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return None, f"stdout is not a JSON array of ids: {proc.stdout[:200]!r}"
    return ids, None


def show(x):
    s = repr(x)
    return s if len(s) <= 40 else s[:37] + "..."


def report_ids(lib, want, got, want_name="library", got_name="bottle"):
    n = min(len(want), len(got))
    i = next((k for k in range(n) if want[k] != got[k]), n)
    log(f"    {want_name} {len(want)} ids, {got_name} {len(got)} ids; first difference at {i}")
    lo = max(0, i - 4)
    for label, ids in ((want_name, want), (got_name, got)):
        window = ids[lo:i + 5]
        if lib is None:
            pieces = " ".join(str(t) for t in window)
        else:
            pieces = " ".join(f"{t}:{show(lib.piece(t))}" for t in window)
        log(f"    {label:>10} [{lo}:{lo + len(window)}] {pieces}")


def report_bytes(want, got, what, want_name="library", got_name="bottle"):
    n = min(len(want), len(got))
    i = next((k for k in range(n) if want[k] != got[k]), n)
    log(f"    {what}: {want_name} {len(want)} bytes, {got_name} {len(got)} bytes; first "
        f"difference at byte {i}")
    log(f"    {want_name:>10} {want[max(0, i - 24):i + 24]!r}")
    log(f"    {got_name:>10} {got[max(0, i - 24):i + 24]!r}")


def compare(bottle, work, cases, texts, refs):
    """bottle against the references: its ids of every text, and its decode of the library's
    ids of every text and of the decode-only sequences. Together with the library's own round
    trip (references()), equal ids and equal decodes make bottle's decode(encode(x)) == x
    wherever the tokenizer is lossless. Returns {tokenizer: (checks, failures)}."""
    text_dir = work / "texts"
    ids_dir = work / "ids"
    text_dir.mkdir(exist_ok=True)
    ids_dir.mkdir(exist_ok=True)
    for name, raw in texts:
        (text_dir / f"{name}.txt").write_bytes(raw)
    jobs = []  # (case, "encode" | "decode", name, input file, what bottle must print)
    rng = random.Random(20240601)
    for case in cases:
        for name, _ in texts:
            ids, decoded = refs[case.name, name]
            jobs.append((case, "encode", name, text_dir / f"{name}.txt", ids))
            if name.startswith("paragraph_"):
                continue  # decoded within the whole test text (each run of bottle costs)
            path = ids_dir / f"{case.name}__{name}.json"
            path.write_text(json.dumps(ids))
            jobs.append((case, "decode", name, path, decoded))
        for name, ids in decode_only_ids(case.lib, rng):
            path = ids_dir / f"{case.name}__{name}.json"
            path.write_text(json.dumps(ids))
            jobs.append((case, "decode", name, path, case.lib.decode(ids).encode("utf-8")))

    def run(job):
        case, what, _, path, _ = job
        return run_bottle(bottle, case, path, what == "decode")

    # bottle's runs wait as much as they compute (its start-up): two per core.
    with ThreadPoolExecutor(max_workers=2 * (os.cpu_count() or 2)) as pool:
        results = list(pool.map(run, jobs))

    # The details of the first few failures of each tokenizer, then a count.
    shown = 5
    stats = {c.name: [0, 0] for c in cases}
    for (case, what, name, _, want), (got, err) in zip(jobs, results):
        st = stats[case.name]
        st[0] += 1
        if err is None and got == want:
            continue
        st[1] += 1
        if st[1] > shown:
            continue
        if err is not None:
            log(f"FAIL: {case.name} {what} {name}: bottle {err}")
        elif what == "encode":
            log(f"FAIL: {case.name} encode {name}: the ids differ")
            report_ids(case.lib, want, got)
        else:
            log(f"FAIL: {case.name} decode {name}: the text differs")
            report_bytes(want, got, "decode")
    for case in cases:
        if stats[case.name][1] > shown:
            log(f"FAIL: {case.name}: {stats[case.name][1] - shown} more failures not shown")
    return stats


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bottle", type=Path, help="the bottle binary")
    ap.add_argument("--work", type=Path, required=True,
                    help="folder for the corpus, the tokenizers, the texts and the ids")
    ap.add_argument("--make-only", action="store_true",
                    help="only train and write the tokenizers and the test text into --work")
    ap.add_argument("--bpe-vocab", type=int, default=2000,
                    help="vocabulary of the byte-level BPEs (default 2000)")
    args = ap.parse_args()
    if not args.make_only and args.bottle is None:
        ap.error("--bottle is required (or --make-only)")
    if args.bpe_vocab < 300:
        ap.error("--bpe-vocab must be at least 300")
    start = time.monotonic()
    from tiktoken_ext.openai_public import r50k_pat_str
    if r50k_pat_str != R50K_PATTERN:
        sys.exit(f"tokenizer_oracle: FAIL (oracle): tiktoken's r50k_base pattern is now "
                 f"{r50k_pat_str!r}")
    log(f"tokenizers {tokenizers.__version__}, sentencepiece {spm.__version__}, "
        f"tiktoken {tiktoken.__version__}")
    work = args.work.resolve()
    raw = make_all(work, args.bpe_vocab)
    cases = load_cases(work)
    if args.make_only:
        for case in cases:
            log(f"{case.name:<16} {case.lib.kind:<14} vocab {case.lib.vocab:>6}  "
                f"{shlex.join([str(case.path)] + case.bottle_args)}")
        log(f"test text: {work / 'test_text.txt'}")
        return 0
    bottle = args.bottle.resolve()
    if not bottle.is_file():
        sys.exit(f"tokenizer_oracle: FAIL: no bottle binary at {bottle}")
    texts = make_texts(raw, (work / "corpus.txt").read_bytes())
    refs, oracle_failures = references(cases, texts)
    failed = not check_tiktoken_agrees(refs, texts) or any(oracle_failures.values())
    log(f"references computed at {time.monotonic() - start:.1f} s; running bottle")
    stats = compare(bottle, work, cases, texts, refs)
    for case in cases:
        checks, failures = stats[case.name]
        failures += oracle_failures[case.name]
        ids = sum(len(refs[case.name, name][0]) for name, _ in texts)
        verdict = "OK" if failures == 0 else f"FAIL ({failures} of {checks} checks)"
        failed |= failures > 0
        log(f"{case.name:<16} {case.lib.kind:<14} vocab {case.lib.vocab:>6}  {ids:>8} ids  "
            f"{checks:>3} checks  {verdict}")
    log(f"{'FAILED' if failed else 'all tokenizers exact'} in {time.monotonic() - start:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
