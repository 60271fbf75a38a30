#!/usr/bin/python3
"""PyTorch reference implementation of the bottle model (docs/design.md §3 and §12).

An oracle written independently of the C++ code: plain torch ops, its own safetensors and
llm.c-shard readers, no third-party package beyond torch and numpy. Run it with
/usr/bin/python3 (the interpreter that has torch). Modes:

  --checkpoint DIR --data SHARD --batch B --seq S --dump OUT.safetensors [--dtype f64]
      batch 0: forward + backward; writes loss [1], logits [B,S,V] and grad/<param> (F32)
      --dtype autocast-bf16: fp32 weights, forward under torch.autocast("cpu", bfloat16)
  --checkpoint DIR --data SHARD --batch B --seq S --eval --batches N
      prints {"loss": mean cross-entropy over the N batches, "tokens": B*S*N}
  --create DIR --hidden D --intermediate F --layers L --heads H [--kv-heads K] --vocab V
           [--kind none|svd|cola|lax] [--rank R] [--ranks q=8,down=4] [--tied] [--seed S]
           [--bf16] [--mlp-gate-act true|false]
      writes a random checkpoint (config.json + model.safetensors)
  --checkpoint DIR --data SHARD --batch B --seq S --bench --steps N --warmup W --threads T
           [--device cpu|cuda] [--dtype f32|autocast-bf16] [--compile]
      times training steps (forward + backward, the global grad norm and clipping at 1.0,
      AdamW); prints one JSON line. --device cuda: the model on the GPU, each timed step
      between torch.cuda.synchronize() calls, attention by scaled_dot_product_attention
      (causal), the fused AdamW; fails with "CUDA is not available" without a GPU.
      --dtype autocast-bf16: fp32 master weights, the forward and loss under
      torch.autocast(DEVICE, bfloat16), the backward and AdamW step as in f32. --compile:
      the forward and loss through torch.compile, compiled in an untimed first step; if
      compiling fails, the JSON says compile_failed and compile_error (its first line) and
      the times are eager ones.
  --checkpoint DIR --data SHARD --batch B --seq S --train --steps N --out OUT.safetensors
           [--dtype f64|f32] [--optimizer adamw|muon] [--lr 3e-4] [--weight-decay 0.1]
           [--beta1 0.9] [--beta2 0.95] [--eps 1e-8] [--max-norm 1.0] [--warmup-steps 0]
           [--decay cosine|linear|constant] [--min-lr-ratio 0.1] [--seed 1234] [--no-shuffle]
           [--grad-accum M] [--on-nonfinite stop|skip] [--muon-momentum 0.95]
           [--muon-nesterov true|false] [--muon-ns-steps 5] [--jitter J]
      N optimizer steps of `bottle train` from the checkpoint's weights, on one process, with
      the defaults of bottle's TOML keys (optimizer.*, lr_scheduler.*, training.max_norm,
      .seed, .grad_accum_steps, .on_nonfinite; --muon-* are the Muon group's settings). The
      optimizer's and the schedule's settings are rounded to fp32 first, as bottle holds
      them (max_norm stays a double, as bottle's does). Per step, as TrainStep::step does
      (docs/design.md §9):
        batches: the windows of SHARD in bottle's TokenLoader order (window k is tokens
          [k*B*S, k*B*S + B*S + 1); each epoch a Fisher-Yates permutation keyed by
          (seed, epoch, 0) from splitmix64, or in order with --no-shuffle), M per step;
        loss: mean cross-entropy, each micro-batch's gradient scaled by 1/M;
        the global gradient norm (squares summed in float64); a non-finite loss or norm
          stops with an error, or with --on-nonfinite skip leaves everything as it was
          (the optimizer's step count included);
        clipping: gradients times max_norm / (norm + 1e-6) when norm > max_norm (> 0);
        the rate of lr_scheduler at the 0-based step (warmup ramp, then decay);
        adamw: decoupled weight decay p -= lr*(m_hat/(sqrt(v_hat) + eps) + wd*p), none on
          the embedding table, the norms and LaX's LN_r (lm_head and G decay);
        muon: every 2-D weight of model.layers.* (W, A, B, G) takes Muon (Moonlight's
          variant, torch.optim.Muon with adjust_lr_fn="match_rms_adamw"): buf = mu*buf + g,
          u = g + mu*buf (nesterov) or buf, X = u/max(|u|_F, 1e-7) (transposed when rows >
          cols), ns_steps of X = a*X + (b*A + c*A*A)*X with A = X*X^T and (a, b, c) =
          (3.4445, -4.7750, 2.0315), then W -= lr*wd*W + lr*0.2*sqrt(max(rows, cols))*X;
          the rest (embedding, lm_head, 1-D parameters) takes the AdamW above.
      Both optimizers are written here in plain torch ops (not torch.optim). --jitter J > 0
      first moves every weight of the checkpoint one fp32 ulp up or down at random (seed J):
      another fp32 trajectory, to measure how far rounding alone carries one. Writes
      OUT.safetensors: every parameter's final value (F32, the checkpoint's names) and the
      metadata "losses", "grad_norms", "lrs", "skipped" (JSON lists, one entry per step; a
      step's loss is its batch's before the update, as metrics.jsonl's "loss") and
      "optimizer", "dtype", "steps".
  --self-test
      checks of the oracle itself: Newton-Schulz's singular values, AdamW's first step, the
      data order's permutations.
Errors print one line on stderr, naming the file at fault, and exit 1.
"""
import argparse, ctypes, inspect, json, math, os, statistics, struct, sys, time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas_core as openblas_choice  # noqa: E402  (its own module, so tests can run it)


def openblas_core():
    """(core name, how it was chosen) of the OpenBLAS behind libblas.so.3, or (None, why not).

    Re-executes this process with OPENBLAS_CORETYPE set where tools/openblas_core.py decides
    so (an unrecognised CPU on SSE fallback kernels). Must run before numpy or torch load the
    library.
    """
    try:
        lib = ctypes.CDLL("libblas.so.3")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None, "libblas.so.3 is not OpenBLAS"
    try:
        with open("/proc/cpuinfo") as f:
            flags = openblas_choice.cpu_flags(f.read())
    except OSError:
        flags = set()
    force, source = openblas_choice.decide(core, flags, os.environ)
    if force is None:
        return core, source
    if "OPENBLAS_CORETYPE" in os.environ:  # a pinned core, overridden (benches only)
        os.environ["BOTTLE_OPENBLAS_PINNED"] = os.environ["OPENBLAS_CORETYPE"]
    os.environ.update(OPENBLAS_CORETYPE=force, BOTTLE_OPENBLAS_CHOSEN=core)
    os.execv(sys.executable, [sys.executable] + sys.argv)


BLAS_CORE, BLAS_CORE_SOURCE = openblas_core()
BLAS_CORE_PINNED = openblas_choice.pinned_core(os.environ)

import numpy as np
import torch
import torch.nn.functional as F


class RefError(Exception):
    pass


PROJS = ("q", "k", "v", "o", "gate", "up", "down")
ATTN = ("q", "k", "v", "o")
KINDS = ("none", "svd", "cola", "lax")
LAX_LN_EPS = 1e-6

def read_bytes(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise RefError(f"{path}: {e.strerror}")


# ---------------------------------------------------------------- safetensors
# dtype -> (numpy dtype of the stored bits, bytes per element)
ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


def read_safetensors(path):
    """Returns {name: float32 numpy array}; BF16/F16 are widened exactly."""
    data = read_bytes(path)
    if len(data) < 8:
        raise RefError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise RefError(f"{path}: header length {n} runs past the end of the file")
    try:
        header = json.loads(data[8:8 + n])
    except ValueError as e:
        raise RefError(f"{path}: bad JSON header: {e}")
    if not isinstance(header, dict):
        raise RefError(f"{path}: JSON header is not an object")
    base, out = 8 + n, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape, (b, e) = info["dtype"], [int(s) for s in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise RefError(f"{path}: tensor {name}: malformed header entry")
        if dt not in ST_DTYPES:
            raise RefError(f"{path}: tensor {name}: unsupported dtype {dt}")
        npdt, width = ST_DTYPES[dt]
        count = math.prod(shape)
        if e - b != count * width or b < 0 or base + e > len(data):
            raise RefError(f"{path}: tensor {name}: data_offsets {[b, e]} do not fit shape {shape}")
        arr = np.frombuffer(data, dtype=npdt, count=count, offset=base + b)
        # bf16 is the top half of an f32: shift the bits up.
        arr = (arr.astype(np.uint32) << 16).view(np.float32) if dt == "BF16" else arr.astype(np.float32)
        out[name] = arr.reshape(shape)
    return out


def write_safetensors(path, tensors, metadata=None, bf16=False):
    """tensors: {name: torch tensor}; written as F32 (or BF16, round-to-nearest-even)."""
    header = {"__metadata__": {str(k): str(v) for k, v in metadata.items()}} if metadata else {}
    blobs, off = [], 0
    for name, t in tensors.items():
        t = t.detach().to(torch.float32).contiguous().cpu()
        if bf16:
            raw, dt = t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes(), "BF16"
        else:
            raw, dt = t.numpy().astype("<f4").tobytes(), "F32"
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * (-len(hj) % 8)  # data start 8-byte aligned
    try:
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(hj)) + hj + b"".join(blobs))
    except OSError as e:
        raise RefError(f"{path}: {e.strerror}")


# ---------------------------------------------------------------- config and parameters
def load_config(ckpt):
    path = os.path.join(ckpt, "config.json")
    try:
        raw = json.loads(read_bytes(path))
    except ValueError as e:
        raise RefError(f"{path}: invalid JSON: {e}")
    return parse_config(raw, path)


def parse_config(raw, path):
    if not isinstance(raw, dict):
        raise RefError(f"{path}: not a JSON object")

    def get(obj, key, typ, default=None):
        if key not in obj:
            if default is None:
                raise RefError(f"{path}: missing key {key}")
            return default
        v = obj[key]
        # JSON numbers: an int is a fine float, but a bool is neither int nor float.
        if not isinstance(v, (int, float) if typ is float else typ) or (typ is not bool and isinstance(v, bool)):
            raise RefError(f"{path}: key {key} must be {typ.__name__}, got {v!r}")
        return typ(v)

    c = SimpleNamespace(path=path)
    c.d, c.ff = get(raw, "hidden_size", int), get(raw, "intermediate_size", int)
    c.L, c.H, c.V = get(raw, "num_hidden_layers", int), get(raw, "num_attention_heads", int), get(raw, "vocab_size", int)
    c.Hkv = get(raw, "num_key_value_heads", int, c.H)
    c.max_pos = get(raw, "max_position_embeddings", int, 1 << 30)
    c.eps, c.theta = get(raw, "rms_norm_eps", float, 1e-5), get(raw, "rope_theta", float, 10000.0)
    c.tied = get(raw, "tie_word_embeddings", bool, False)
    if min(c.d, c.ff, c.L, c.H, c.V, c.Hkv) <= 0 or c.d % c.H or c.H % c.Hkv or (c.d // c.H) % 2:
        raise RefError(f"{path}: inconsistent sizes (need hidden % heads == 0, heads % kv_heads == 0, even head dim)")
    c.hd = c.d // c.H
    bn = raw.get("bottleneck") or {}
    if not isinstance(bn, dict):
        raise RefError(f"{path}: bottleneck must be an object")
    c.kind = get(bn, "kind", str, "none")
    if c.kind not in KINDS:
        raise RefError(f"{path}: bottleneck.kind must be one of {KINDS}, got {c.kind!r}")
    if get(bn, "activation", str, "silu") != "silu":
        raise RefError(f"{path}: bottleneck.activation: only silu is supported")
    c.gate_act = get(bn, "mlp_gate_act", bool, c.kind == "none")
    rank, ranks = get(bn, "rank", int, max(c.d // 4, 1)), get(bn, "ranks", dict, {}) or {}
    for p in ranks:
        if p not in PROJS:
            raise RefError(f"{path}: bottleneck.ranks: unknown projection {p!r}")
    c.ranks = {p: get(ranks, p, int, rank) for p in PROJS}
    if min(c.ranks.values()) <= 0:
        raise RefError(f"{path}: bottleneck ranks must be positive")
    return c


def proj_prefix(i, p):
    return f"model.layers.{i}." + ("self_attn." if p in ATTN else "mlp.") + f"{p}_proj."


def param_shapes(c):
    """Every parameter name the config implies, with its shape, in HF order."""
    io = {"q": (c.d, c.H * c.hd), "k": (c.d, c.Hkv * c.hd), "v": (c.d, c.Hkv * c.hd),
          "o": (c.H * c.hd, c.d), "gate": (c.d, c.ff), "up": (c.d, c.ff), "down": (c.ff, c.d)}
    s = {"model.embed_tokens.weight": (c.V, c.d)}
    for i in range(c.L):
        s[f"model.layers.{i}.input_layernorm.weight"] = (c.d,)
        for p in PROJS:
            if p == "gate":
                s[f"model.layers.{i}.post_attention_layernorm.weight"] = (c.d,)
            pre, (din, dout), r = proj_prefix(i, p), io[p], c.ranks[p]
            if c.kind == "none":
                s[pre + "weight"] = (dout, din)
                continue
            s[pre + "A.weight"], s[pre + "B.weight"] = (r, din), (dout, r)
            if c.kind == "lax" and i > 0:
                s[pre + "G.weight"], s[pre + "ln.weight"], s[pre + "ln.bias"] = (r, r), (r,), (r,)
    s["model.norm.weight"] = (c.d,)
    if not c.tied:
        s["lm_head.weight"] = (c.V, c.d)
    return s


def load_checkpoint(ckpt, dtype, jitter=0):
    """jitter > 0: every weight moved one fp32 ulp up or down, at random from that seed."""
    c = load_config(ckpt)
    path = os.path.join(ckpt, "model.safetensors")
    raw = read_safetensors(path)
    want = param_shapes(c)
    for name, shape in want.items():
        if name not in raw:
            raise RefError(f"{path}: missing tensor {name} (config {c.path} implies it)")
        if tuple(raw[name].shape) != shape:
            raise RefError(f"{path}: tensor {name} has shape {list(raw[name].shape)}, config implies {list(shape)}")
    extra = [n for n in raw if n not in want and not n.endswith("rotary_emb.inv_freq")]
    if extra:
        raise RefError(f"{path}: unexpected tensor {extra[0]} for config {c.path}")
    if jitter:
        rng = np.random.default_rng(jitter)
        for n in want:
            away = np.where(rng.random(raw[n].shape) < 0.5, -np.inf, np.inf).astype(np.float32)
            raw[n] = np.nextafter(raw[n], away)
    params = {n: torch.tensor(raw[n], dtype=dtype).requires_grad_() for n in want}
    return c, params


# ---------------------------------------------------------------- model
class Model:
    def __init__(self, c, params, seq, dtype, device="cpu", sdpa=False):
        if seq > c.max_pos:
            raise RefError(f"{c.path}: seq {seq} exceeds max_position_embeddings {c.max_pos}")
        self.c, self.sdpa = c, sdpa
        # Resolve names once so the step loop does no string formatting.
        self.blocks = []
        for i in range(c.L):
            pre = f"model.layers.{i}."
            w = {"n1": params[pre + "input_layernorm.weight"], "n2": params[pre + "post_attention_layernorm.weight"]}
            for p in PROJS:
                pp = proj_prefix(i, p)
                w[p] = {k: params.get(pp + s) for k, s in
                        (("W", "weight"), ("A", "A.weight"), ("B", "B.weight"), ("G", "G.weight"),
                         ("lnw", "ln.weight"), ("lnb", "ln.bias"))}
            self.blocks.append(w)
        self.embed, self.norm = params["model.embed_tokens.weight"], params["model.norm.weight"]
        self.head = self.embed if c.tied else params["lm_head.weight"]
        # RoPE tables computed in f64 then rounded, so f32 runs carry no angle error.
        inv = c.theta ** (-torch.arange(0, c.hd, 2, dtype=torch.float64) / c.hd)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        ang = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = ang.cos().to(device, dtype), ang.sin().to(device, dtype)
        # Additive causal mask, fused into the score matmul by baddbmm.
        self.mask = torch.full((seq, seq), -math.inf, dtype=dtype).triu(1).to(device)

    def rms(self, x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.c.eps) * g

    def proj(self, i, p, x, lat):
        w, kind = self.blocks[i][p], self.c.kind
        if kind == "none":
            return F.linear(x, w["W"])
        z = F.linear(x, w["A"])
        if kind == "svd":
            return F.linear(z, w["B"])
        if kind == "lax" and i > 0:  # latent crossing from the same position in block i-1
            # In the weights' dtype: CPU autocast leaves layer_norm to its inputs' dtypes and
            # refuses bf16 input with fp32 weights (CUDA autocast runs it in fp32).
            zc = (z + F.linear(lat[p], w["G"])).to(w["lnw"].dtype)
            z = F.layer_norm(zc, (z.shape[-1],), w["lnw"], w["lnb"], LAX_LN_EPS)
        u = F.silu(z)
        lat[p] = u
        return F.linear(u, w["B"])

    def rope(self, x):  # x: (B, heads, S, hd)
        h = x.shape[-1] // 2
        return x * self.cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * self.sin

    def attn(self, i, n, lat):
        c, (B, S, _) = self.c, n.shape
        q = self.rope(self.proj(i, "q", n, lat).view(B, S, c.H, c.hd).transpose(1, 2))
        k = self.rope(self.proj(i, "k", n, lat).view(B, S, c.Hkv, c.hd).transpose(1, 2))
        v = self.proj(i, "v", n, lat).view(B, S, c.Hkv, c.hd).transpose(1, 2)
        if c.Hkv != c.H:  # query head h reads kv head h // (H / Hkv)
            k = k.repeat_interleave(c.H // c.Hkv, dim=1)
            v = v.repeat_interleave(c.H // c.Hkv, dim=1)
        if self.sdpa:  # the fused kernels (flash or memory-efficient) a GPU run would use
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.proj(i, "o", o.transpose(1, 2).reshape(B, S, c.H * c.hd), lat)
        q, k, v = (t.reshape(B * c.H, S, c.hd) for t in (q, k, v))
        s = torch.baddbmm(self.mask[:S, :S], q, k.transpose(1, 2), alpha=1.0 / math.sqrt(c.hd))
        o = torch.bmm(s.softmax(-1), v).view(B, c.H, S, c.hd).transpose(1, 2).reshape(B, S, c.H * c.hd)
        return self.proj(i, "o", o, lat)

    def mlp(self, i, n, lat):
        g = self.proj(i, "gate", n, lat)
        if self.c.gate_act:
            g = F.silu(g)
        return self.proj(i, "down", g * self.proj(i, "up", n, lat), lat)

    def forward(self, tokens):
        x, lat = F.embedding(tokens, self.embed), {}
        for i, w in enumerate(self.blocks):
            h = x + self.attn(i, self.rms(x, w["n1"]), lat)
            x = h + self.mlp(i, self.rms(h, w["n2"]), lat)
        return F.linear(self.rms(x, self.norm), self.head)

    def loss(self, logits, targets):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------- data
def read_shard(path):
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(1024)
    except OSError as e:
        raise RefError(f"{path}: {e.strerror}")
    if len(head) < 1024:
        raise RefError(f"{path}: shorter than the 1024-byte shard header")
    magic, version, count = struct.unpack("<3i", head[:12])
    formats = {(20240520, 1): ("<u2", 2), (20240801, 7): ("<u4", 4)}
    if (magic, version) not in formats:
        raise RefError(f"{path}: unknown shard magic/version {magic}/{version}")
    dt, width = formats[magic, version]
    if count < 0 or size != 1024 + count * width:
        raise RefError(f"{path}: size {size} != 1024 + {count} tokens x {width} bytes")
    # Mapped, not read: eval and bench touch only the batches they use.
    return np.memmap(path, dtype=dt, mode="r", offset=1024, shape=(count,)) if count else np.zeros(0, dt)


def get_batch(tokens, k, B, S, V, path):
    start = k * B * S
    if start + B * S + 1 > len(tokens):
        raise RefError(f"{path}: batch {k} needs {start + B * S + 1} tokens, shard has {len(tokens)}")
    buf = tokens[start:start + B * S + 1].astype(np.int64)
    if buf.max() >= V:
        raise RefError(f"{path}: token id {int(buf.max())} >= vocab_size {V}")
    buf = torch.from_numpy(buf)
    return buf[:-1].view(B, S), buf[1:].view(B, S)


# ---------------------------------------------------------------- modes
def mode_dump(a, dtype):
    c, params = load_checkpoint(a.checkpoint, dtype)
    model = Model(c, params, a.seq, dtype)
    x, y = get_batch(read_shard(a.data), 0, a.batch, a.seq, c.V, a.data)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "autocast-bf16"):
        logits = model.forward(x)
        loss = model.loss(logits, y)
    loss.backward()
    out = {"loss": loss.detach().float().reshape(1), "logits": logits.detach().float()}
    out.update({"grad/" + n: p.grad for n, p in params.items()})
    write_safetensors(a.dump, out, {"dtype": a.dtype, "batch": a.batch, "seq": a.seq})


def mode_eval(a, dtype):
    c, params = load_checkpoint(a.checkpoint, dtype)
    model, tokens = Model(c, params, a.seq, dtype), read_shard(a.data)
    total = 0.0
    with torch.no_grad():
        for k in range(a.batches):
            x, y = get_batch(tokens, k, a.batch, a.seq, c.V, a.data)
            total += float(model.loss(model.forward(x), y))
    # Every batch has B*S tokens, so the mean of batch means is the mean over all tokens.
    print(json.dumps({"loss": total / a.batches, "tokens": a.batch * a.seq * a.batches}))


def set_threads(n):
    """n intra-op threads for torch and for the BLAS; returns the BLAS library in use.

    fp32 GEMMs in Debian's torch go to whatever libblas.so.3 resolves to (netlib's reference
    BLAS unless an optimized one is installed: single-threaded, ~3 GFLOP/s), so bench
    reports it. OpenBLAS keeps its own thread pool; size it too so --threads means it.
    """
    torch.set_num_threads(n)
    if torch.get_num_interop_threads() != 1:  # settable once per process, else it aborts
        torch.set_num_interop_threads(1)
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({os.path.realpath(l.split()[-1]) for l in f if "blas" in l.lower() and "/" in l})
    except OSError:
        return "unknown"
    for lib in libs:
        try:
            ctypes.CDLL(lib).openblas_set_num_threads(n)
        except (OSError, AttributeError):
            pass
    return ",".join(libs) or "unknown"


def bench_device(a):
    """The torch.device --device names; fails cleanly where it cannot run."""
    if a.device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RefError(f"--device cuda: CUDA is not available (torch {torch.__version__}, "
                       f"built for CUDA {torch.version.cuda or 'none'})")
    return torch.device("cuda")


def first_line(e):
    text = f"{type(e).__name__}: {e}".strip()
    return text.splitlines()[0] if text else type(e).__name__


def mode_bench(a, dtype):
    device = bench_device(a)
    cuda = device.type == "cuda"
    if cuda:  # fp32 is fp32, as bottle's cuBLASLt GEMMs (CUBLAS_COMPUTE_32F) are
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    c, params = load_checkpoint(a.checkpoint, dtype)
    params = {n: p.detach().to(device).requires_grad_() for n, p in params.items()}
    model, tokens = Model(c, params, a.seq, dtype, device, sdpa=cuda), read_shard(a.data)
    nb = (len(tokens) - 1) // (a.batch * a.seq)
    batches = [tuple(t.to(device) for t in get_batch(tokens, k, a.batch, a.seq, c.V, a.data))
               for k in range(min(max(nb, 1), 8))]
    plist = list(params.values())
    # bottle's step: betas 0.9/0.95, weight decay 0.1, clipping at global norm 1.0.
    fused = cuda
    opt = torch.optim.AdamW(plist, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if fused else {"foreach": True}))
    autocast = a.dtype == "autocast-bf16"
    clip = torch.nn.utils.clip_grad_norm_
    clip_args = {"foreach": True} if "foreach" in inspect.signature(clip).parameters else {}

    def forward_loss(x, y):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            return model.loss(model.forward(x), y)

    def sync():
        if cuda:
            torch.cuda.synchronize()

    first = {}  # the first step's loss and gradient norm, which bench step checks

    def step(fn, x, y):
        loss = fn(x, y)
        loss.backward()
        norm = clip(plist, 1.0, **clip_args)
        if not first:
            first.update(loss=float(loss), grad_norm=float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    fn, compile_failed, compile_error, compile_s = forward_loss, False, None, None
    if a.compile:
        # Compiled on its first call: an untimed step of its own, before the warm-up.
        x, y = batches[0]
        sync()
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(forward_loss)
            step(compiled, x, y)
            sync()
            fn, compile_s = compiled, time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 (any failure to compile falls back to eager)
            compile_failed, compile_error = True, first_line(e)
            opt.zero_grad(set_to_none=True)
            sync()
    times, loss = [], None
    for i in range(a.warmup + a.steps):
        x, y = batches[i % len(batches)]
        sync()
        t0 = time.perf_counter()
        loss = step(fn, x, y)
        sync()
        if i >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(times)
    out = {"ms_per_step_median": med, "ms_per_step_min": min(times), "ms_per_step_max": max(times),
           "tokens_per_s": a.batch * a.seq / (med / 1e3), "threads": a.threads,
           "torch": torch.__version__, "blas": a.blas, "blas_core": BLAS_CORE,
           "blas_core_source": BLAS_CORE_SOURCE, "blas_core_pinned": BLAS_CORE_PINNED,
           "first_loss": first.get("loss"), "first_grad_norm": first.get("grad_norm"),
           "device": a.device, "dtype": a.dtype,
           "attention": "sdpa" if model.sdpa else "baddbmm+softmax+bmm",
           "adamw": "fused" if fused else "foreach", "loss": float(loss),
           "compile": a.compile}
    if cuda:
        out["gpu"] = torch.cuda.get_device_name(device)
        out["cuda"] = torch.version.cuda
        out["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    if a.compile:
        out["compile_failed"] = compile_failed
        if compile_failed:
            out["compile_error"] = compile_error
        else:
            out["compile_seconds"] = compile_s
    print(json.dumps(out))


# ---------------------------------------------------------------- training (--train)
# bottle's data order (src/train/data_loader.cpp), written afresh: splitmix64, its three-word
# hash and Lemire's unbiased draw, over Python integers cut to 64 bits.
MASK64 = (1 << 64) - 1


def splitmix64(state):
    """Advances state[0] and returns the next output, as bottle's splitmix64."""
    state[0] = (state[0] + 0x9E3779B97F4A7C15) & MASK64
    z = state[0]
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def hash3(a, b, c):
    s = [a & MASK64]
    s = [splitmix64(s) ^ b]
    s = [splitmix64(s) ^ c]
    return splitmix64(s)


def below(state, n):
    """Uniform in [0, n): multiply-and-reject on the top 64 bits of a 128-bit product."""
    m = splitmix64(state) * n
    if (m & MASK64) < n:
        threshold = ((1 << 64) - n) % n
        while (m & MASK64) < threshold:
            m = splitmix64(state) * n
    return m >> 64


def permutation(n, shuffle, key):
    p = list(range(n))
    if shuffle:
        state = [key]
        for i in range(n, 1, -1):
            j = below(state, i)
            p[i - 1], p[j] = p[j], p[i - 1]
    return p


class Windows:
    """The windows one process reads of one shard, epoch after epoch: stream element k is
    window window_order(epoch)[k mod W] of epoch k div W (W windows an epoch). One shard's
    order of shards is the identity, so only the windows are permuted, keyed by
    (seed, epoch, file 0)."""

    def __init__(self, count, per_batch, seed, shuffle):
        self.W, self.seed, self.shuffle, self.orders = (count - 1) // per_batch, seed, shuffle, {}

    def __getitem__(self, k):
        epoch, g = divmod(k, self.W)
        if epoch not in self.orders:
            self.orders[epoch] = permutation(self.W, self.shuffle, hash3(self.seed, epoch, 0))
        return self.orders[epoch][g]


def f32(x):
    """A hyperparameter as bottle holds it (a float)."""
    return float(np.float32(x))


def lr_at(a, step):
    """bottle's LrSchedule::at (src/train/lr_schedule.cpp) for 0-based `step`: the warmup ramp
    in float, the decay's shape in double, the rate rounded to float."""
    lr = np.float32(a.lr)
    if step < a.warmup_steps:
        return float(lr * np.float32(step + 1) / np.float32(a.warmup_steps))
    if a.decay == "constant":
        return float(lr)
    span = max(1, a.steps - a.warmup_steps - 1)
    progress = min(max((step - a.warmup_steps) / span, 0.0), 1.0)
    shape = 1.0 - progress if a.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    min_lr = float(lr) * f32(a.min_lr_ratio)
    return float(np.float32(min_lr + (float(lr) - min_lr) * shape))


NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(u, steps):
    """Muon's approximate orthogonalisation of a matrix: singular values pushed towards 1."""
    x = u / torch.clamp(torch.linalg.norm(u), min=1e-7)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        g = x @ x.T
        x = a * x + (b * g + c * (g @ g)) @ x
    return x.T if tall else x


def decays(name):
    """bottle's ParamSpec::weight_decay: off for the embedding table, the norms and LN_r."""
    return not (name == "model.embed_tokens.weight" or
                name.endswith(("norm.weight", ".ln.weight", ".ln.bias")))


def uses_muon(name, p):
    """Muon's group: every 2-D weight inside the blocks (W, A, B, G); the rest is AdamW's."""
    return name.startswith("model.layers.") and p.dim() == 2


class Optimizer:
    """AdamW (bottle's adamw_step) and, with muon, Muon on its group; state zero at start."""

    def __init__(self, a, params):
        self.a, self.params, self.step_count = a, params, 0
        self.muon = {n for n, p in params.items() if a.optimizer == "muon" and uses_muon(n, p)}
        self.state = {n: (torch.zeros_like(p),) if n in self.muon else
                      (torch.zeros_like(p), torch.zeros_like(p)) for n, p in params.items()}

    @torch.no_grad()
    def step(self, lr, scale):
        """One update with every gradient multiplied by `scale` (clipping) first."""
        a = self.a
        self.step_count += 1
        b1, b2, eps, wd = f32(a.beta1), f32(a.beta2), f32(a.eps), f32(a.weight_decay)
        c1, c2 = 1.0 / (1.0 - b1 ** self.step_count), 1.0 / (1.0 - b2 ** self.step_count)
        for name, p in self.params.items():
            g = p.grad * scale
            if name in self.muon:
                (buf,) = self.state[name]
                mu = f32(a.muon_momentum)
                buf.mul_(mu).add_(g)
                u = g + mu * buf if a.muon_nesterov == "true" else buf
                x = newton_schulz(u, a.muon_ns_steps)
                p.sub_(lr * wd * p)
                p.sub_(lr * 0.2 * math.sqrt(max(p.shape)) * x)
                continue
            m, v = self.state[name]
            m.mul_(b1).add_((1.0 - b1) * g)
            v.mul_(b2).add_((1.0 - b2) * g * g)
            update = (m * c1) / (torch.sqrt(v * c2) + eps)
            p.sub_(lr * (update + (wd if decays(name) else 0.0) * p))


def mode_train(a, dtype):
    c, params = load_checkpoint(a.checkpoint, dtype, a.jitter)
    model, tokens = Model(c, params, a.seq, dtype), read_shard(a.data)
    per_batch = a.batch * a.seq
    if len(tokens) < per_batch + 1:
        raise RefError(f"{a.data}: {len(tokens)} tokens, too few for one window of {per_batch} + 1")
    windows = Windows(len(tokens), per_batch, a.seed, not a.no_shuffle)
    opt = Optimizer(a, params)
    max_norm = a.max_norm
    losses, norms, lrs, skipped = [], [], [], []
    k = 0  # the next stream element
    for step in range(a.steps):
        for p in params.values():
            p.grad = None
        loss = 0.0
        for _ in range(a.grad_accum):
            x, y = get_batch(tokens, windows[k], a.batch, a.seq, c.V, a.data)
            k += 1
            micro = model.loss(model.forward(x), y)
            (micro / a.grad_accum).backward()
            loss += float(micro)
        loss /= a.grad_accum
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params.values()))
        lr = lr_at(a, step)
        finite = math.isfinite(loss) and math.isfinite(norm)
        if not finite and a.on_nonfinite == "stop":
            raise RefError(f"step {step + 1}: the loss is {loss} (grad norm {norm}); stopping")
        if finite:
            scale = f32(max_norm / (norm + 1e-6)) if 0 < max_norm < norm else 1.0
            opt.step(lr, scale)
        losses.append(loss), norms.append(norm), lrs.append(lr), skipped.append(not finite)
    meta = {"losses": json.dumps(losses), "grad_norms": json.dumps(norms), "lrs": json.dumps(lrs),
            "skipped": json.dumps(skipped), "optimizer": a.optimizer, "dtype": a.dtype,
            "steps": a.steps}
    write_safetensors(a.out, {n: p.detach() for n, p in params.items()}, meta)


def mode_self_test():
    """Checks of the pieces the C++ trajectory test cannot single out; exits 1 on a failure."""
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    g = torch.Generator().manual_seed(3)
    for shape in ((48, 32), (32, 48), (8, 8)):
        u = torch.randn(shape, generator=g, dtype=torch.float64)
        x = newton_schulz(u, 5)
        # An odd matrix polynomial keeps u's singular vectors: U^T x V is diagonal, and the
        # quintic's band leaves its entries (x's singular values) within ~[0.68, 1.13].
        uu, _, vt = torch.linalg.svd(u, full_matrices=False)
        core = uu.T @ x @ vt.T
        sv = core.diagonal()
        off = float((core - torch.diag(sv)).abs().max())
        check(x.shape == u.shape and float(sv.min()) > 0.6 and float(sv.max()) < 1.2 and off < 1e-9,
              f"Newton-Schulz on {list(shape)}: singular values in [{float(sv.min()):.3f}, "
              f"{float(sv.max()):.3f}] (want within [0.6, 1.2]), off the singular vectors "
              f"{off:.1e}")
    # AdamW's first step: bias correction makes it lr * g / (|g| + eps) plus the decay.
    a = SimpleNamespace(optimizer="adamw", beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1)
    w0 = torch.randn((4, 3), generator=g, dtype=torch.float64)
    params = {"lm_head.weight": w0.clone(), "model.norm.weight": torch.ones(3, dtype=torch.float64)}
    for p in params.values():
        p.grad = torch.randn(p.shape, generator=g, dtype=torch.float64)
    grads = {n: p.grad.clone() for n, p in params.items()}
    Optimizer(a, params).step(1e-2, 0.5)
    for n, wd in (("lm_head.weight", f32(0.1)), ("model.norm.weight", 0.0)):
        g0, p0 = grads[n] * 0.5, (w0 if n == "lm_head.weight" else torch.ones(3, dtype=torch.float64))
        want = p0 - 1e-2 * (g0 / (g0.abs() + f32(1e-8)) + wd * p0)
        err = float((params[n] - want).abs().max())
        check(err < 1e-9, f"AdamW's first step of {n}: off by {err:.1e}")
    # Muon's group: the blocks' matrices (W, A, B, G); AdamW keeps the embedding, lm_head and
    # every vector (norms, LN_r's weight and bias).
    for kind in ("none", "lax"):
        c = parse_config({"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                          "num_attention_heads": 4, "vocab_size": 64,
                          "bottleneck": {"kind": kind, "rank": 8}}, "self-test")
        shapes = param_shapes(c)
        muon = {n for n, sh in shapes.items() if uses_muon(n, torch.zeros(sh))}
        want = {n for n in shapes if n.startswith("model.layers.") and
                n.endswith(("_proj.weight", ".A.weight", ".B.weight", ".G.weight"))}
        check(muon == want and len(muon) == (14 if kind == "none" else 35),
              f"Muon's group for {kind}: {len(muon)} matrices, AdamW's {len(shapes) - len(muon)}")
    # Muon's first step from a zero buffer: u = (1 + mu) g, whose direction NS normalises away.
    a = SimpleNamespace(optimizer="muon", beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
                        muon_momentum=0.95, muon_nesterov="true", muon_ns_steps=5)
    w0 = torch.randn((48, 32), generator=g, dtype=torch.float64)
    params = {"model.layers.0.mlp.gate_proj.weight": w0.clone()}
    params["model.layers.0.mlp.gate_proj.weight"].grad = torch.randn((48, 32), generator=g,
                                                                    dtype=torch.float64)
    grad = params["model.layers.0.mlp.gate_proj.weight"].grad.clone()
    Optimizer(a, params).step(1e-2, 1.0)
    want = w0 - 1e-2 * f32(0.1) * w0 - 1e-2 * 0.2 * math.sqrt(48) * newton_schulz(grad, 5)
    err = float((params["model.layers.0.mlp.gate_proj.weight"] - want).abs().max())
    check(err < 1e-12, f"Muon's first step of a 48 x 32 matrix: off by {err:.1e}")
    # The data order: a permutation of every window each epoch, different epochs differing,
    # the identity without shuffling.
    w = Windows(10 * 32 + 1, 32, 1234, True)
    e0, e1 = [w[k] for k in range(10)], [w[k] for k in range(10, 20)]
    check(sorted(e0) == list(range(10)) and sorted(e1) == list(range(10)) and e0 != e1,
          f"shuffled windows: epoch 0 {e0}, epoch 1 {e1}")
    check([Windows(10 * 32 + 1, 32, 1234, False)[k] for k in range(12)] == list(range(10)) + [0, 1],
          "unshuffled windows in order, epoch after epoch")
    sys.stdout.flush()
    if failures:
        raise RefError(f"self-test: {len(failures)} check(s) failed")


def mode_create(a):
    if a.kind not in KINDS:
        raise RefError(f"--kind must be one of {KINDS}")
    ranks = dict(item.partition("=")[::2] for item in filter(None, (a.ranks or "").split(",")))
    if any(p not in PROJS or not r.isdigit() for p, r in ranks.items()):
        raise RefError(f"--ranks {a.ranks!r}: want e.g. q=8,down=4")
    ranks = {p: int(r) for p, r in ranks.items()}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "hidden_size": a.hidden, "intermediate_size": a.intermediate, "num_hidden_layers": a.layers,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads or a.heads,
           "vocab_size": a.vocab, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "tie_word_embeddings": a.tied,
           "torch_dtype": "bfloat16" if a.bf16 else "float32"}
    # Full-rank: omit `bottleneck` as a plain HF config would, unless the gate switch is set.
    if a.kind != "none" or a.mlp_gate_act is not None:
        bn = {"kind": a.kind, "rank": a.rank or a.hidden // 4, "activation": "silu"}
        bn.update({"ranks": ranks} if ranks else {})
        bn.update({} if a.mlp_gate_act is None else {"mlp_gate_act": a.mlp_gate_act == "true"})
        cfg["bottleneck"] = bn
    cpath = os.path.join(a.create, "config.json")
    c = parse_config(cfg, cpath)  # validate before writing anything
    try:
        os.makedirs(a.create, exist_ok=True)
        with open(cpath, "w") as f:
            json.dump(cfg, f, indent=2)
    except OSError as e:
        raise RefError(f"{cpath}: {e.strerror}")
    g = torch.Generator().manual_seed(a.seed)
    rnd = lambda shape, std: torch.randn(shape, generator=g) * std
    shapes, out = param_shapes(c), {}
    for name, shape in shapes.items():
        if name.endswith(("norm.weight", "ln.weight")):
            t = 1.0 + rnd(shape, 0.1)  # perturbed so a misplaced gamma shows up in the logits
        elif name.endswith("ln.bias"):
            t = rnd(shape, 0.1)
        elif name.endswith(("A.weight", "B.weight")):  # CoLA init, std r^-1/4 (d_in + d_out)^-1/4
            (r, din), (dout, _) = shapes[name[:-8] + "A.weight"], shapes[name[:-8] + "B.weight"]
            t = rnd(shape, (r * (din + dout)) ** -0.25)
        else:
            t = rnd(shape, 0.02)
        out[name] = t
    write_safetensors(os.path.join(a.create, "model.safetensors"), out, {"format": "pt"}, bf16=a.bf16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.error = lambda msg: (print(f"torch_reference: {msg}", file=sys.stderr), sys.exit(1))
    ap.add_argument("--checkpoint"), ap.add_argument("--data")
    ap.add_argument("--batch", type=int, default=4), ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--dtype", choices=("f32", "fp32", "f64", "autocast-bf16"), default="f32")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dump", metavar="OUT")
    ap.add_argument("--eval", action="store_true"), ap.add_argument("--batches", type=int, default=1)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--steps", type=int, default=10), ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--create", metavar="DIR")
    for k in ("hidden", "intermediate", "layers", "heads", "kv-heads", "vocab", "rank"):
        ap.add_argument("--" + k, type=int)
    ap.add_argument("--kind", default="none"), ap.add_argument("--ranks")
    ap.add_argument("--tied", action="store_true"), ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--seed", type=int)  # --create's generator (0); --train's data order (1234)
    ap.add_argument("--mlp-gate-act", choices=("true", "false"))
    ap.add_argument("--train", action="store_true"), ap.add_argument("--out", metavar="OUT")
    ap.add_argument("--optimizer", choices=("adamw", "muon"), default="adamw")
    # bottle's defaults (src/train/train_config.h).
    for k, v in (("lr", 3e-4), ("weight-decay", 0.1), ("beta1", 0.9), ("beta2", 0.95),
                 ("eps", 1e-8), ("max-norm", 1.0), ("min-lr-ratio", 0.1), ("muon-momentum", 0.95)):
        ap.add_argument("--" + k, type=float, default=v)
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--decay", choices=("cosine", "linear", "constant"), default="cosine")
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--on-nonfinite", choices=("stop", "skip"), default="stop")
    ap.add_argument("--muon-nesterov", choices=("true", "false"), default="true")
    ap.add_argument("--muon-ns-steps", type=int, default=5)
    ap.add_argument("--jitter", type=int, default=0)
    ap.add_argument("--self-test", action="store_true")
    a = ap.parse_args()

    a.blas = set_threads(max(a.threads, 1))
    dtype = torch.float64 if a.dtype == "f64" else torch.float32
    try:
        if a.self_test:
            return mode_self_test()
        if a.create:
            a.seed = 0 if a.seed is None else a.seed
            missing = [k for k in ("hidden", "intermediate", "layers", "heads", "vocab") if getattr(a, k) is None]
            if missing:
                ap.error("--create needs --" + ", --".join(missing))
            return mode_create(a)
        if sum(map(bool, (a.dump, a.eval, a.bench, a.train))) != 1:
            ap.error("choose exactly one of --create, --dump, --eval, --bench, --train, --self-test")
        if not a.checkpoint or not a.data:
            ap.error("--checkpoint and --data are required")
        if min(a.batch, a.seq, a.batches, a.steps) <= 0 or a.warmup < 0:
            ap.error("--batch, --seq, --batches and --steps must be positive")
        if (a.device != "cpu" or a.compile) and not a.bench:
            ap.error("--device and --compile apply to --bench only")
        if a.train:
            if not a.out:
                ap.error("--train needs --out")
            if a.dtype not in ("f32", "fp32", "f64"):
                ap.error("--train runs in f32 or f64")
            if a.grad_accum <= 0 or a.muon_ns_steps < 0 or a.warmup_steps < 0 or a.max_norm < 0:
                ap.error("--grad-accum must be positive; --muon-ns-steps, --warmup-steps and "
                         "--max-norm must not be negative")
            a.seed = 1234 if a.seed is None else a.seed
            return mode_train(a, dtype)
        (mode_dump if a.dump else mode_eval if a.eval else mode_bench)(a, dtype)
    except RefError as e:
        print(f"torch_reference: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
