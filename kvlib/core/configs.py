"""Every named model configuration: published models for sizing (notebooks 05 and 06), and the
configurations the benchmarks time (random weights), so that no benchmark spells its own.

Each entry is the model's published config.json (Hugging Face hub, the model's own repository)
written as a kvlib ModelConfig, with the total parameter count and the source beside it. Sizes
only: nothing here downloads or loads weights. GPT-2 and Falcon are not Llama-shaped (a
two-matrix GELU MLP, tied embeddings, learned positions or parallel attention), so their
ModelConfig is right for the KV cache (layers, KV heads, head_dim) and `params` is counted from
their own architecture, not from ModelConfig.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvlib.core.model import ModelConfig, num_params


@dataclass(frozen=True)
class RealModel:
    name: str
    config: ModelConfig  # layers, heads, KV heads, head_dim as published (max_seq_len: its context)
    params: int  # total parameters, embeddings included
    attention: str  # "MHA", "GQA" or "MQA"
    source: str  # where the figures come from
    sliding_window: int | None = None  # tokens each layer attends to, and so caches (rolling buffer); None: all
    mlp: str = "SwiGLU"  # SwiGLU: gate and up (d_model -> hidden_dim), down back; GELU: two matrices, no gate
    trained_context: int | None = None  # tokens per sequence in training, where the paper says (else max_seq_len)

    @property
    def context(self) -> int:
        """The tokens it was trained to attend to: trained_context where the paper gives it, else its config's."""
        return self.trained_context or self.config.max_seq_len

    def cached_tokens(self, kv_len: int) -> int:
        """Tokens the KV cache holds after kv_len tokens of context: all of them, or the sliding window's last ones."""
        if kv_len > self.config.max_seq_len:
            raise ValueError(f"{self.name} has a context of {self.config.max_seq_len:,} tokens; {kv_len:,} is past it")
        return kv_len if self.sliding_window is None else min(kv_len, self.sliding_window)

    def weight_bytes(self, bytes_per_element: int = 2) -> int:
        """Bytes of all the weights at bytes_per_element each (2: fp16/bf16)."""
        return self.params * bytes_per_element


def _hub(repo: str) -> str:
    return f"https://huggingface.co/{repo}/blob/main/config.json"


def _llama(name, source, attention, **sizes) -> RealModel:
    config = ModelConfig(**sizes)
    return RealModel(name, config, num_params(config), attention, source)


def _gpt2_small() -> RealModel:
    # 12 layers of: attention 4 x (768 x 768 + 768 bias), MLP 768 x 3072 x 2 (+ biases), 2 LayerNorms;
    # tied token embedding 50257 x 768 and learned positions 1024 x 768; final LayerNorm.
    C, F, L, V, P = 768, 3072, 12, 50257, 1024
    layer = 4 * (C * C + C) + (C * F + F) + (F * C + C) + 2 * 2 * C
    params = V * C + P * C + L * layer + 2 * C  # = 124,439,808, the count transformers reports
    config = ModelConfig(vocab_size=V, d_model=C, n_layers=L, n_heads=12, n_kv_heads=12, hidden_dim=F, max_seq_len=P)
    return RealModel("GPT-2 small", config, params, "MHA", _hub("openai-community/gpt2"), mlp="GELU")


def _falcon_7b() -> RealModel:
    # 32 parallel-attention layers: fused q/k/v 4544 x (71 + 2) x 64, dense 4544 x 4544, MLP
    # 4544 x 18176 x 2, one LayerNorm (weight + bias); tied embedding 65024 x 4544; final LayerNorm.
    C, F, L, V, D = 4544, 18176, 32, 65024, 64
    layer = C * (71 + 2) * D + C * C + 2 * C * F + 2 * C
    params = V * C + L * layer + 2 * C  # = 6,921,720,704
    config = ModelConfig(vocab_size=V, d_model=C, n_layers=L, n_heads=71, n_kv_heads=1, hidden_dim=F, max_seq_len=2048)
    return RealModel("Falcon-7B", config, params, "MQA", _hub("tiiuae/falcon-7b"), mlp="GELU")


REAL_MODELS: dict[str, RealModel] = {
    m.name: m
    for m in (
        _gpt2_small(),
        _llama(
            "Llama-2-7B",
            _hub("meta-llama/Llama-2-7b-hf"),
            "MHA",
            vocab_size=32000,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=32,
            hidden_dim=11008,
            max_seq_len=4096,
        ),
        _llama(
            "Llama-2-70B",
            _hub("meta-llama/Llama-2-70b-hf"),
            "GQA",
            vocab_size=32000,
            d_model=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            hidden_dim=28672,
            max_seq_len=4096,
        ),
        _llama(
            "Llama-3-8B",
            _hub("meta-llama/Meta-Llama-3-8B"),
            "GQA",
            vocab_size=128256,
            d_model=4096,
            n_layers=32,
            n_heads=32,
            n_kv_heads=8,
            hidden_dim=14336,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        _llama(
            "Llama-3-70B",
            _hub("meta-llama/Meta-Llama-3-70B"),
            "GQA",
            vocab_size=128256,
            d_model=8192,
            n_layers=80,
            n_heads=64,
            n_kv_heads=8,
            hidden_dim=28672,
            max_seq_len=8192,
            rope_theta=500000.0,
        ),
        # sliding_window 4096 in its config.json: each layer attends to (and caches) the last 4,096 tokens only
        # (Jiang et al., "Mistral 7B", arXiv:2310.06825, "rolling buffer cache"). Its config.json's
        # max_position_embeddings is 32,768, but the paper's Table 1 gives context_len 8,192: trained at 8,192
        replace(
            _llama(
                "Mistral-7B",
                _hub("mistralai/Mistral-7B-v0.1"),
                "GQA",
                vocab_size=32000,
                d_model=4096,
                n_layers=32,
                n_heads=32,
                n_kv_heads=8,
                hidden_dim=14336,
                max_seq_len=32768,
            ),
            sliding_window=4096,
            trained_context=8192,
        ),
        # Qwen2.5 adds biases to q, k and v (a few hundred thousand parameters, left out here). Its config.json's
        # 131,072 positions are reached with YaRN; the Qwen2.5 report (arXiv:2412.15115, its long-context
        # pre-training) trains at 4,096 tokens, then at 32,768 in the final pre-training stage: trained at 32,768
        replace(
            _llama(
                "Qwen2.5-7B",
                _hub("Qwen/Qwen2.5-7B"),
                "GQA",
                vocab_size=152064,
                d_model=3584,
                n_layers=28,
                n_heads=28,
                n_kv_heads=4,
                hidden_dim=18944,
                max_seq_len=131072,
                rope_theta=1000000.0,
            ),
            trained_context=32768,
        ),
        _falcon_7b(),
    )
}


def real_model(name: str) -> RealModel:
    """One entry of REAL_MODELS by name, with an error that lists the names."""
    try:
        return REAL_MODELS[name]
    except KeyError:
        raise ValueError(f"no real model {name!r}; known: {', '.join(REAL_MODELS)}") from None


# ---------------------------------------------------------------------------------------------
# The benchmarks' own configurations (random weights: timing does not care what they mean)


def gpt2_size_config() -> ModelConfig:
    """A Llama-shaped model the size of GPT-2 small: 12 layers, 12 heads, d_model 768, ~134M weights."""
    return ModelConfig(
        vocab_size=32000, d_model=768, n_layers=12, n_heads=12, n_kv_heads=12, hidden_dim=2048, max_seq_len=1024
    )


def gqa_bench_config(n_kv_heads: int = 8, max_seq_len: int = 16392) -> ModelConfig:
    """A random-weight model whose KV cache outweighs its weights at long context: 8 heads of 64,
    4 layers, a narrow MLP (~7M matrix weights, 29 MB in float32; MHA's cache is 16 KiB per token, 128 MiB at 8k)."""
    return ModelConfig(
        vocab_size=256,
        d_model=512,
        n_layers=4,
        n_heads=8,
        n_kv_heads=n_kv_heads,
        hidden_dim=512,
        max_seq_len=max_seq_len,
    )


# `kvlib bench gqa` recordings made before 2026-12-01 measured a step's fixed part as the step at this
# many cached tokens (later ones fit a line over kv_len); the figure of notebook 06 labels them so
GQA_FIXED_KV_LEN = 16


def memory_bound_config():
    """A random-weight Llama shape of ~445 MB in float32: over ten times a large CPU's last-level cache.

    Wide and shallow (d_model 2048, 2 layers): each matrix is 16-46 MB, large enough for one core
    to stream it at nearly the full read bandwidth; many small matrices would each pay a start-up.
    """
    return ModelConfig(
        vocab_size=4096, d_model=2048, n_layers=2, n_heads=16, n_kv_heads=16, hidden_dim=5632, max_seq_len=1024
    )


def gpu_decode_config() -> ModelConfig:
    """Llama-2-7B's layer shape with 16 of its 32 layers: ~3.4 B weights, 6.7 GB in bf16, far beyond any GPU cache."""
    return ModelConfig(
        vocab_size=32000, d_model=4096, n_layers=16, n_heads=32, n_kv_heads=32, hidden_dim=11008, max_seq_len=4096
    )


def quick_cache_config() -> ModelConfig:
    """`kvlib bench cache --quick`'s stand-in for the GPT-2-size model: a smoke test of the code, not a measurement."""
    return ModelConfig(
        vocab_size=2000, d_model=128, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=256, max_seq_len=1024
    )


def quick_memory_config() -> ModelConfig:
    """`kvlib bench memory --quick`'s stand-in for the memory-bound model: a smoke test of the code, not a measurement."""
    return ModelConfig(vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=4, hidden_dim=512, max_seq_len=64)


# ---------------------------------------------------------------------------------------------
# Multi-head Latent Attention (notebook 08): models whose cache is one latent per token


@dataclass(frozen=True)
class MLAModel:
    """A published MLA model's attention sizes. Per token and layer the cache holds kv_rank latent
    numbers plus rope_dim for the one rotary key that all heads share (DeepSeek-V2, arXiv 2405.04434,
    section 2.1: d_c = 512, d_h^R = 64)."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    kv_rank: int  # kv_lora_rank: width of the cached latent c_t
    rope_dim: int  # qk_rope_head_dim: the shared rotary key k_t^R, cached beside c_t
    nope_dim: int  # qk_nope_head_dim: per-head key width rebuilt from c_t
    v_dim: int  # v_head_dim: per-head value width rebuilt from c_t
    params: int  # total parameters (all experts), as the model card states
    source: str
    context: int | None = None  # max_position_embeddings in its config.json (YaRN-extended), where known

    def weight_bytes(self, bytes_per_element: int = 2) -> int:
        return self.params * bytes_per_element

    def sizes(self) -> dict[str, int]:
        """The attention sizes notebook 08b's exercises take as keywords: n_heads, nope_dim, rope_dim, v_dim, kv_rank."""
        return {k: getattr(self, k) for k in ("n_heads", "nope_dim", "rope_dim", "v_dim", "kv_rank")}


MLA_MODELS: dict[str, MLAModel] = {
    m.name: m
    for m in (
        # config.json: num_hidden_layers 60, hidden_size 5120, num_attention_heads 128, kv_lora_rank 512,
        # qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, max_position_embeddings 163840; 236B parameters (21B active)
        MLAModel(
            "DeepSeek-V2",
            60,
            5120,
            128,
            512,
            64,
            128,
            128,
            236_000_000_000,
            _hub("deepseek-ai/DeepSeek-V2") + "; arXiv 2405.04434",
            context=163_840,
        ),
        # the same MLA sizes in 61 layers of width 7168; 671B parameters (37B active), arXiv 2412.19437
        MLAModel(
            "DeepSeek-V3",
            61,
            7168,
            128,
            512,
            64,
            128,
            128,
            671_000_000_000,
            _hub("deepseek-ai/DeepSeek-V3") + "; arXiv 2412.19437",
            context=163_840,
        ),
    )
}

# What DeepSeek-V2's "93.3% less KV cache" is measured against (arXiv 2405.04434, section 1): DeepSeek
# LLM 67B, GQA with 8 key/value heads of 128 in 95 layers (its config.json); the 93.3% also counts
# V2's cache quantised to about 6 bits per number against 16 (section 3.2.1's deployment).
DEEPSEEK_67B = _llama(
    "DeepSeek-LLM-67B",
    _hub("deepseek-ai/deepseek-llm-67b-base"),
    "GQA",
    vocab_size=102400,
    d_model=8192,
    n_layers=95,
    n_heads=64,
    n_kv_heads=8,
    hidden_dim=22016,
    max_seq_len=4096,
)
