#!/usr/bin/env python3
"""The transformers side of the HF round trip (tests/interop/test_hf_roundtrip.cpp).

Runs with the Python of .venv-hf (scripts/setup.sh: pinned transformers on Debian's PyTorch).
Every mode prints one JSON object on stdout; errors print one line on stderr and exit 1.

  model --model DIR [--tokens FILE] [--generate IDS --new-tokens N] [--text FILE]
        [--prompt TEXT]
      Loads DIR as transformers would: LlamaForCausalLM for config.json's LlamaForCausalLM,
      else AutoModelForCausalLM with trust_remote_code (bottle's modeling file). Reports the
      class, the missing / unexpected / mismatched keys and every warning logged while loading.
      --tokens: a safetensors file with `tokens` [B, S] (I32) and bottle's `logits` [B, S, V]
      (F32); reports max |logits - bottle's| and max |bottle's|, in float32.
      --generate: greedy generate() of N tokens after the JSON list of prompt ids, never
      stopping early. --text: AutoTokenizer.from_pretrained(DIR)'s ids of the file's text
      (no special tokens added, special tokens' strings taken as text, as bottle encodes a
      corpus) and its class; --slow: the slow (Python) tokenizer class instead.
      --prompt TEXT: transformers' usual call, model.generate(**tokenizer(TEXT,
      return_tensors="pt"), max_new_tokens=N, do_sample=False), with AutoTokenizer of DIR;
      reports the new ids, whether the last is EOS, and everything the load and the call
      printed, logged or warned.
  save-llama --out DIR --hidden D --intermediate F --layers L --heads H --kv-heads K --vocab V
             [--tied] --dtype f32|bf16|f16 [--max-shard-size SIZE] [--seed S]
      A random LlamaForCausalLM written by save_pretrained (safetensors; sharded with an index
      when SIZE is smaller than the model).
  tokenizers --out DIR
      Trains a tokenizer of each kind bottle reads on ~300 KB of Debian's fortunes:
      DIR/bpe/tokenizer.json (GPT-2-style byte-level BPE, 400 ids with <|endoftext|>),
      DIR/sp_llama/tokenizer.model (SentencePiece BPE as LLaMA's: identity normalization, byte
      fallback), DIR/sp_unigram/tokenizer.model (SentencePiece's defaults: nmt_nfkc, extra
      whitespace removed) and DIR/tiktoken/tokenizer.tiktoken (bpe's vocabulary as ranks; its
      <|endoftext|> id is reported as "tiktoken_special").
  loss --model DIR --data SHARD --batch B --seq S [--batches K]
      transformers' mean cross-entropy in float32 over the first K batches of an llm.c shard,
      read as `bottle eval` reads them (window k: tokens [k·B·S, (k+1)·B·S + 1), row j its
      [j·S, j·S + S) and targets shifted by one).
"""
import argparse
import json
import logging
import os
import sys
import warnings

import numpy as np
import torch


def fail(message):
    print(f"hf_oracle: {message}", file=sys.stderr)
    sys.exit(1)


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def load_model(directory):
    import transformers
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    with open(os.path.join(directory, "config.json")) as f:
        architectures = json.load(f).get("architectures") or []
    transformers.logging.set_verbosity_warning()
    collect = Collect()
    logger = logging.getLogger("transformers")
    logger.addHandler(collect)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if architectures == ["LlamaForCausalLM"]:
            model, info = LlamaForCausalLM.from_pretrained(
                directory, output_loading_info=True, torch_dtype=torch.float32)
        else:
            model, info = AutoModelForCausalLM.from_pretrained(
                directory, output_loading_info=True, trust_remote_code=True,
                torch_dtype=torch.float32)
    logger.removeHandler(collect)
    warned = collect.messages + [str(w.message) for w in caught]
    return model.eval(), info, warned


def read_shard(path):
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype="<i4")
        dtype = {20240520: "<u2", 20240801: "<u4"}.get(int(header[0]))
        if dtype is None:
            fail(f"{path}: not an llm.c token shard (magic {int(header[0])})")
        return np.frombuffer(f.read(), dtype=dtype)[: int(header[2])].astype(np.int64)


def mode_model(args):
    from safetensors.torch import load_file

    model, info, warned = load_model(args.model)
    out = {
        "class": type(model).__name__,
        "missing": sorted(info["missing_keys"]),
        "unexpected": sorted(info["unexpected_keys"]),
        "mismatched": [str(m) for m in info["mismatched_keys"]],
        "load_warnings": warned,
    }
    with torch.no_grad():
        if args.tokens:
            tensors = load_file(args.tokens)
            tokens = tensors["tokens"].long()
            expected = tensors["logits"].float()
            logits = model(input_ids=tokens).logits.float()
            out["max_abs_diff"] = float((logits - expected).abs().max())
            out["max_abs_logit"] = float(expected.abs().max())
        if args.generate:
            from transformers import GenerationConfig

            prompt = torch.tensor([json.loads(args.generate)], dtype=torch.long)
            config = GenerationConfig(max_new_tokens=args.new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=0)
            ids = model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                 generation_config=config)
            out["generated"] = ids[0, prompt.shape[1]:].tolist()
    if args.text:
        out.update(tokenize(args.model, args.text, not args.slow))
    if args.prompt is not None:
        out.update(generate_from_text(model, args.model, args.prompt, args.new_tokens))
    print(json.dumps(out))


def generate_from_text(model, directory, prompt, new_tokens):
    """The call users copy from transformers' documentation, watched for every complaint."""
    import tempfile

    from transformers import AutoTokenizer

    collect = Collect()
    logger = logging.getLogger("transformers")
    logger.addHandler(collect)
    # The tokenizers library prints its complaints from Rust, past Python's sys.stdout.
    sys.stdout.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile() as printed, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        os.dup2(printed.fileno(), 1)
        os.dup2(printed.fileno(), 2)
        try:
            tokenizer = AutoTokenizer.from_pretrained(directory)
            inputs = tokenizer(prompt, return_tensors="pt")
            with torch.no_grad():
                ids = model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False)
        finally:
            sys.stdout.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
        printed.seek(0)
        output = printed.read().decode("utf-8", "replace")
    logger.removeHandler(collect)
    new = ids[0, inputs["input_ids"].shape[1]:].tolist()
    # transformers 4.45 announces a change of its own on every LLaMA forward, whatever the
    # model files say: not a complaint about them.
    notice = "Starting from v4.46, the `logits` model output will have the same type"
    complaints = collect.messages + [str(w.message) for w in caught] + output.splitlines()
    return {
        "prompt_inputs": sorted(inputs.keys()),
        "prompt_generated": new,
        "prompt_ended_at_eos": bool(new) and new[-1] == tokenizer.eos_token_id,
        "prompt_complaints": [c for c in complaints if c.strip() and not c.startswith(notice)],
    }


def tokenize(directory, text_file, use_fast):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, use_fast=use_fast)
    with open(text_file, encoding="utf-8", newline="") as f:  # "\r\n" stays
        text = f.read()
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return {"tokenizer_class": type(tokenizer).__name__, "tokenizer_ids": ids}


FORTUNES = "/usr/share/games/fortunes"


def mode_tokenizers(args):
    import base64

    import sentencepiece as spm
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = sorted(os.path.join(FORTUNES, n) for n in os.listdir(FORTUNES)
                   if os.path.isfile(os.path.join(FORTUNES, n)) and not n.endswith((".dat", ".u8")))
    if not files:
        fail(f"no fortunes files in {FORTUNES}: run scripts/setup.sh (Debian's package fortunes)")
    corpus = b"".join(open(f, "rb").read() for f in files)
    corpus = corpus[: corpus.rfind(b"\n", 0, 300_000) + 1]
    os.makedirs(args.out, exist_ok=True)
    corpus_path = os.path.join(args.out, "corpus.txt")
    with open(corpus_path, "wb") as f:
        f.write(corpus)

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train([corpus_path], trainers.BpeTrainer(
        vocab_size=400, show_progress=False, special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(os.path.join(args.out, "bpe"), exist_ok=True)
    bpe.save(os.path.join(args.out, "bpe", "tokenizer.json"))

    spm.set_random_generator_seed(1234)
    common = dict(vocab_size=400, num_threads=1, shuffle_input_sentence=False,
                  input_sentence_size=0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    for name, options in (
            ("sp_llama", dict(model_type="bpe", byte_fallback=True,
                              normalization_rule_name="identity", remove_extra_whitespaces=False,
                              split_digits=True, allow_whitespace_only_pieces=True)),
            ("sp_unigram", dict(model_type="unigram"))):
        os.makedirs(os.path.join(args.out, name), exist_ok=True)
        spm.SentencePieceTrainer.train(input=corpus_path,
                                       model_prefix=os.path.join(args.out, name, "tokenizer"),
                                       logstream=open(os.devnull, "w"),  # closed by it
                                       **options, **common)

    # GPT-2's byte <-> character table of the byte-level vocabulary.
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    special = bpe.token_to_id("<|endoftext|>")
    os.makedirs(os.path.join(args.out, "tiktoken"), exist_ok=True)
    with open(os.path.join(args.out, "tiktoken", "tokenizer.tiktoken"), "w") as f:
        for token, rank in sorted(bpe.get_vocab(with_added_tokens=False).items(),
                                  key=lambda kv: kv[1]):
            if rank != special:
                f.write(f"{base64.b64encode(bytes(chars[c] for c in token)).decode()} {rank}\n")
    print(json.dumps({"corpus": corpus_path, "tiktoken_special": special}))


def mode_save_llama(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_position,
        tie_word_embeddings=args.tied, initializer_range=0.1, rms_norm_eps=1e-6)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # norm gains off 1, so that a misread norm shows
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    model.to(dtype).save_pretrained(args.out, safe_serialization=True,
                                    max_shard_size=args.max_shard_size)
    print(json.dumps({"files": sorted(os.listdir(args.out)),
                      "parameters": sum(p.numel() for p in model.parameters())}))


def mode_loss(args):
    model, _, _ = load_model(args.model)
    tokens = read_shard(args.data)
    window = args.batch * args.seq
    batches = (len(tokens) - 1) // window
    if args.batches:
        batches = min(batches, args.batches)
    if batches < 1:
        fail(f"{args.data}: {len(tokens)} tokens hold no batch of {args.batch} x {args.seq}")
    total, count = 0.0, 0
    with torch.no_grad():
        for k in range(batches):
            chunk = torch.from_numpy(tokens[k * window: (k + 1) * window + 1])
            inputs = chunk[:-1].view(args.batch, args.seq)
            targets = chunk[1:].view(args.batch, args.seq)
            logits = model(input_ids=inputs).logits.float()
            total += float(torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"))
            count += targets.numel()
    print(json.dumps({"loss": total / count, "tokens": count, "batches": batches}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    m = modes.add_parser("model")
    m.add_argument("--model", required=True)
    m.add_argument("--tokens")
    m.add_argument("--generate")
    m.add_argument("--prompt")
    m.add_argument("--new-tokens", type=int, default=32)
    m.add_argument("--text")
    m.add_argument("--slow", action="store_true")
    s = modes.add_parser("save-llama")
    s.add_argument("--out", required=True)
    for name in ("hidden", "intermediate", "layers", "heads", "kv-heads", "vocab"):
        s.add_argument(f"--{name}", type=int, required=True)
    s.add_argument("--max-position", type=int, default=128)
    s.add_argument("--tied", action="store_true")
    s.add_argument("--dtype", choices=("f32", "bf16", "f16"), default="f32")
    s.add_argument("--max-shard-size", default="10GB")
    s.add_argument("--seed", type=int, default=0)
    t = modes.add_parser("tokenizers")
    t.add_argument("--out", required=True)
    lo = modes.add_parser("loss")
    lo.add_argument("--model", required=True)
    lo.add_argument("--data", required=True)
    lo.add_argument("--batch", type=int, required=True)
    lo.add_argument("--seq", type=int, required=True)
    lo.add_argument("--batches", type=int, default=0)
    args = parser.parse_args()
    try:
        {"model": mode_model, "save-llama": mode_save_llama, "tokenizers": mode_tokenizers,
         "loss": mode_loss}[args.mode](args)
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        fail(f"{type(e).__name__}: {e}")


if __name__ == "__main__":
    main()
