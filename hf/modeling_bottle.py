"""bottle's low-rank LLaMA (SVD, CoLA, LaX) for Hugging Face transformers.

The same model as bottle's docs/design.md §3, in plain PyTorch, with the tensor names of
bottle's checkpoints. A LLaMA decoder whose seven projections q, k, v, o, gate, up, down
(W: d_in -> d_out) are each a bottleneck A: d_in -> r, a latent stage, then B: r -> d_out:

    svd:   y = B(A x)
    cola:  y = B(silu(A x))
    lax:   z = A x;  z' = LN_r(z + G u_prev) in every block but the first, else z' = z;
           u = silu(z');  y = B u
           (u_prev: the previous block's u of the same projection; LN_r: LayerNorm, eps 1e-6)

per block:  h = x + o(Attention(q(n1), k(n1), v(n1))),    n1 = RMSNorm(x)
            x = h + down(act(gate(n2)) * up(n2)),         n2 = RMSNorm(h)
            act = silu when bottleneck.mlp_gate_act, else the identity
logits = lm_head(RMSNorm(x)); RoPE as LlamaForCausalLM (rotate-half, base rope_theta).

generate() works; there is no key/value cache (each step runs the whole prefix), which keeps
this file short: use bottle's `sample` for fast generation.
"""
import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

try:  # transformers >= 4.50 no longer gives PreTrainedModel generate()
    from transformers import GenerationMixin
except ImportError:  # pragma: no cover
    GenerationMixin = object

from .configuration_bottle import BottleConfig


class RMSNorm(nn.Module):
    def __init__(self, width, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Bottleneck(nn.Module):
    """One projection: A (d_in -> r), the latent stage, B (r -> d_out)."""

    def __init__(self, d_in, d_out, rank, kind, crosses):
        super().__init__()
        self.kind = kind
        self.A = nn.Linear(d_in, rank, bias=False)
        self.B = nn.Linear(rank, d_out, bias=False)
        self.crosses = kind == "lax" and crosses
        if self.crosses:
            self.G = nn.Linear(rank, rank, bias=False)
            self.ln = nn.LayerNorm(rank, eps=1e-6)

    def forward(self, x, u_prev):
        """Returns y and the latent u that the next block's same projection crosses with."""
        z = self.A(x)
        if self.kind == "svd":
            return self.B(z), None
        if self.crosses:
            z = self.ln(z + self.G(u_prev))
        u = F.silu(z)
        return self.B(u), u


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    def __init__(self, config, index):
        super().__init__()
        d, ff, hd = config.hidden_size, config.intermediate_size, config.head_dim
        kv = config.num_key_value_heads * hd
        kind = config.bottleneck["kind"]
        shapes = {"q": (d, d), "k": (d, kv), "v": (d, kv), "o": (d, d),
                  "gate": (d, ff), "up": (d, ff), "down": (ff, d)}
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, hd
        self.gate_act = config.mlp_gate_act
        self.input_layernorm = RMSNorm(d, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(d, config.rms_norm_eps)

        def projection(name):
            d_in, d_out = shapes[name]
            return Bottleneck(d_in, d_out, config.rank_of(name), kind, crosses=index > 0)

        self.self_attn = nn.ModuleDict({f"{p}_proj": projection(p) for p in ("q", "k", "v", "o")})
        self.mlp = nn.ModuleDict({f"{p}_proj": projection(p) for p in ("gate", "up", "down")})

    def forward(self, x, cos, sin, mask, latents):
        """latents: projection -> the previous block's u (LaX), replaced by this block's."""

        def project(modules, name, inp):
            y, latents[name] = modules[f"{name}_proj"](inp, latents.get(name))
            return y

        b, s, _ = x.shape
        n1 = self.input_layernorm(x)
        q = project(self.self_attn, "q", n1).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = project(self.self_attn, "k", n1).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = project(self.self_attn, "v", n1).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        group = self.heads // self.kv_heads  # query head h reads key/value head h // group
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = (q @ k.transpose(-1, -2)) * self.head_dim**-0.5
        scores = scores.float().masked_fill(~mask, float("-inf"))
        attention = (scores.softmax(-1).to(v.dtype) @ v).transpose(1, 2).reshape(b, s, -1)
        h = x + project(self.self_attn, "o", attention)

        n2 = self.post_attention_layernorm(h)
        gate = project(self.mlp, "gate", n2)
        if self.gate_act:
            gate = F.silu(gate)
        return h + project(self.mlp, "down", gate * project(self.mlp, "up", n2))


class BottlePreTrainedModel(PreTrainedModel):
    config_class = BottleConfig
    base_model_prefix = "model"
    _no_split_modules = ["Block"]

    def _init_weights(self, module):
        # bottle's initialisation (docs/design.md §3): factors N(0, σ²), σ = r^(-1/4)(d_in + d_out)^(-1/4);
        # G and embeddings N(0, 0.02²); norms 1, LayerNorm bias 0.
        if isinstance(module, Bottleneck):
            r, d_in, d_out = module.A.out_features, module.A.in_features, module.B.out_features
            std = (r * (d_in + d_out)) ** -0.25
            nn.init.normal_(module.A.weight, std=std)
            nn.init.normal_(module.B.weight, std=std)
            if module.crosses:
                nn.init.normal_(module.G.weight, std=0.02)
        elif isinstance(module, nn.Embedding) or (isinstance(module, nn.Linear) and module.out_features == self.config.vocab_size):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)


class BottleModel(BottlePreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    def forward(self, input_ids, attention_mask=None):
        b, s = input_ids.shape
        device = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones(b, s, dtype=torch.long, device=device)
        # Positions count real tokens only, so that left padding does not shift RoPE.
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        hd = self.config.head_dim
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, hd, 2, device=device).float() / hd))
        angles = positions.float()[..., None] * inv_freq
        angles = torch.cat((angles, angles), dim=-1)[:, None]  # [b, 1, s, hd]
        x = self.embed_tokens(input_ids)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        causal = torch.ones(s, s, dtype=torch.bool, device=device).tril()
        mask = causal[None, None] & attention_mask.bool()[:, None, None, :]
        mask = mask | torch.eye(s, dtype=torch.bool, device=device)  # a padded row stays finite
        latents = {}
        for block in self.layers:
            x = block(x, cos, sin, mask, latents)
        return self.norm(x)


class BottleForCausalLM(BottlePreTrainedModel, GenerationMixin):
    _tied_weights_keys = ["lm_head.weight"]

    def __init__(self, config):
        super().__init__(config)
        self.model = BottleModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(self, input_ids=None, attention_mask=None, labels=None, return_dict=None, **kwargs):
        logits = self.lm_head(self.model(input_ids, attention_mask)).float()
        loss = None
        if labels is not None:  # labels are the inputs; the model predicts each next one
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                   labels[:, 1:].reshape(-1), ignore_index=-100)
        if return_dict is False:
            return (loss, logits) if loss is not None else (logits,)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def _supports_default_dynamic_cache(self):
        return False
