"""Configuration of bottle's low-rank LLaMA (SVD, CoLA, LaX) for Hugging Face transformers.

bottle writes this file beside the config.json of every low-rank checkpoint, whose `auto_map`
points here, so that `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` builds
the model. The keys are LlamaConfig's plus one object, `bottleneck`:
    {"kind": "svd" | "cola" | "lax", "rank": r, "ranks": {"q": r_q, ...} (per-projection
     overrides, optional), "activation": "silu", "mlp_gate_act": bool}
"""
from transformers import PretrainedConfig

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")
KINDS = ("svd", "cola", "lax")


class BottleConfig(PretrainedConfig):
    model_type = "bottle"

    def __init__(
        self,
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=None,
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        hidden_act="silu",
        tie_word_embeddings=False,
        bottleneck=None,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.hidden_act = hidden_act
        self.bottleneck = dict(bottleneck or {"kind": "svd", "rank": hidden_size // 4})
        kind = self.bottleneck.get("kind")
        if kind not in KINDS:
            raise ValueError(f"bottleneck.kind must be one of {KINDS}, got {kind!r}")
        if self.bottleneck.get("activation", "silu") != "silu":
            raise ValueError("bottleneck.activation: only 'silu' is supported")
        if hidden_act != "silu":
            raise ValueError("hidden_act: only 'silu' is supported")
        unknown = set(self.bottleneck.get("ranks", {})) - set(PROJECTIONS)
        if unknown:
            raise ValueError(f"bottleneck.ranks: unknown projections {sorted(unknown)}")
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)

    @property
    def head_dim(self):
        return self.hidden_size // self.num_attention_heads

    @property
    def mlp_gate_act(self):
        """SiLU on the gate projection's output; off by default (the factors apply σ)."""
        return bool(self.bottleneck.get("mlp_gate_act", False))

    def rank_of(self, projection):
        return int(self.bottleneck.get("ranks", {}).get(projection) or self.bottleneck["rank"])
