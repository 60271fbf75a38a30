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


def load_checkpoint(ckpt, dtype):
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
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mlp-gate-act", choices=("true", "false"))
    a = ap.parse_args()

    a.blas = set_threads(max(a.threads, 1))
    dtype = torch.float64 if a.dtype == "f64" else torch.float32
    try:
        if a.create:
            missing = [k for k in ("hidden", "intermediate", "layers", "heads", "vocab") if getattr(a, k) is None]
            if missing:
                ap.error("--create needs --" + ", --".join(missing))
            return mode_create(a)
        if sum(map(bool, (a.dump, a.eval, a.bench))) != 1:
            ap.error("choose exactly one of --create, --dump, --eval, --bench")
        if not a.checkpoint or not a.data:
            ap.error("--checkpoint and --data are required")
        if min(a.batch, a.seq, a.batches, a.steps) <= 0 or a.warmup < 0:
            ap.error("--batch, --seq, --batches and --steps must be positive")
        if (a.device != "cpu" or a.compile) and not a.bench:
            ap.error("--device and --compile apply to --bench only")
        (mode_dump if a.dump else mode_eval if a.eval else mode_bench)(a, dtype)
    except RefError as e:
        print(f"torch_reference: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
