"""The tiny Llama-style decoder that runs the course from notebook 02 on.

RMSNorm, rotary position embeddings, a SwiGLU MLP and attention in which n_heads query heads
share n_kv_heads key/value heads, so GQA (notebook 06) is a config change. Weights of a
`transformers` Llama load with from_transformers(); the trained tiny model with load_tiny().
Left out on purpose: the KV cache itself (notebook 04's kvlib.kv_cache, used through
forward(..., past_key_values=cache)), generation and sampling (notebook 02), dropout, padding masks, rope scaling.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kvlib.tokenizer import Tokenizer

TINY_DIR = Path(__file__).resolve().parent.parent / "assets" / "tiny"  # where load_tiny() looks
WEIGHTS_FILE, CONFIG_FILE = "model.pt", "config.json"  # fp16 state dict; ModelConfig as JSON
TOKENIZER_FILE, MANIFEST_FILE = "tokenizer.json", "manifest.json"  # characters; sha256 + how it was made


# ---------------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class ModelConfig:
    """Every size of the decoder. The defaults (except vocab_size) are the shipped tiny model."""

    vocab_size: int  # one row per token; the tiny model has one token per corpus character
    d_model: int = 128  # width of the residual stream: small enough to train on a CPU in minutes
    n_layers: int = 4  # enough depth to look up a country and copy out its capital
    n_heads: int = 8  # 8 has divisors 8/4/2/1, so notebook 06 can pool to every GQA group count
    n_kv_heads: int = 8  # == n_heads: trained as MHA, converted to GQA later by pooling K/V heads
    hidden_dim: int = 256  # SwiGLU width, 2 x d_model (Llama: ~8/3 x): ample for 137 x 2 facts
    max_seq_len: int = 512  # rotary table length: notebooks generate a few hundred tokens
    rope_theta: float = 10000.0  # rotary base, as in Llama 2: wavelengths from 2*pi to ~10^4
    norm_eps: float = 1e-5  # keeps RMSNorm finite on an all-zero row; Llama's value

    def __post_init__(self):
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"ModelConfig.{name} must be a positive number, got {value!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                "each key/value head serves a whole group of query heads"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even: rotary embeddings turn pairs of features")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: 1 is MHA, n_heads is MQA."""
        return self.n_heads // self.n_kv_heads

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "ModelConfig":
        unknown = sorted(set(data) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {unknown}")
        return cls(**data)


# ---------------------------------------------------------------------------------------------
# Helpers: rotary embeddings and the causal mask


def rotary_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every rotation angle, each (max_seq_len, head_dim), float32.

    Feature pair (i, i + head_dim/2) at position p turns by p * theta^(-2i/head_dim): the
    half-split ("rotate_half") layout of `transformers` Llama, so its weights load unchanged.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim  # (D/2,)
    inv_freq = 1.0 / (theta**exponents)  # (D/2,) radians per position, as transformers computes it
    angles = torch.outer(torch.arange(max_seq_len).float(), inv_freq)  # (P,) x (D/2,) -> (P, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (P, D/2) -> (P, D): both halves of a pair share an angle
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis: a 90-degree turn of each pair."""
    x1, x2 = x.chunk(2, dim=-1)  # (..., D) -> 2 x (..., D/2)
    return torch.cat([-x2, x1], dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate queries or keys x (batch, heads, seq_len, head_dim) by angles cos, sin (seq_len, head_dim).

    cos and sin are the rows of rotary_tables() at the tokens' absolute positions.
    """
    assert x.shape[-2:] == cos.shape, f"expected angles for {tuple(x.shape[-2:])}, got {tuple(cos.shape)}"
    return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)  # (B, h, T, D) * (T, D) -> (B, h, T, D)


def _causal_mask(seq_len: int, kv_len: int, device=None) -> torch.Tensor:
    """Boolean (seq_len, kv_len) mask; True where query i may attend to key j.

    Queries are the last seq_len of kv_len positions: row i allows j <= kv_len - seq_len + i.
    """
    i = torch.arange(seq_len, device=device)[:, None]  # (T, 1)
    j = torch.arange(kv_len, device=device)[None, :]  # (1, S)
    return j <= i + (kv_len - seq_len)  # (T, S)


# ---------------------------------------------------------------------------------------------
# Layers


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last axis (no mean subtraction, no bias), computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # squares of 16-bit activations overflow: normalise in float32
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., C) / (..., 1)
        return self.weight * x32.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), d_model -> hidden_dim -> d_model."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (B, T, C) -> (B, T, hidden) -> (B, T, C); the gate decides how much of `up` passes
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Causal attention: n_heads query heads share n_kv_heads key/value heads (MHA, GQA or MQA).

    Three steps, each its own method so that the KV cache of notebook 04 can reuse them:
    project_q and project_kv (projection + rotary at absolute positions), then attend.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        C, H, H_kv, D = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        self.q_proj = nn.Linear(C, H * D, bias=False)
        self.k_proj = nn.Linear(C, H_kv * D, bias=False)  # GQA: fewer key/value heads, smaller matrices
        self.v_proj = nn.Linear(C, H_kv * D, bias=False)
        self.o_proj = nn.Linear(H * D, C, bias=False)

    def project_q(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Queries (batch, n_heads, seq_len, head_dim) of x (batch, seq_len, d_model), rotated."""
        (B, T, _), H, D = x.shape, self.n_heads, self.head_dim
        q = self.q_proj(x).view(B, T, H, D).transpose(1, 2)  # (B, T, H*D) -> (B, H, T, D)
        return apply_rotary(q, cos, sin)

    def project_kv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Keys and values (batch, n_kv_heads, seq_len, head_dim) of x; keys rotated, values not.

        This is all a KV cache stores: the result depends only on the token and its absolute
        position (cos, sin), never on later tokens, so it can be computed once and kept.
        """
        (B, T, _), H_kv, D = x.shape, self.n_kv_heads, self.head_dim
        k = self.k_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        return apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """softmax(q k^T / sqrt(D), causal) v for q (B, H, T, D) against k, v (B, H_kv, S, D).

        The T queries are the last T of the S positions (S > T once a cache holds earlier keys).
        Query head h reads key/value head h // group_size, i.e. k.repeat_interleave(group_size,
        dim=1); SDPA's enable_gqa does that without copying. Returns (B, H, T, D).
        """
        T, S = q.shape[-2], k.shape[-2]
        assert (q.shape[1], k.shape[1]) == (self.n_heads, self.n_kv_heads), f"q {tuple(q.shape)}, k {tuple(k.shape)}"
        assert S >= T, f"{T} queries need at least {T} keys, got {S}"
        # an explicit bottom-right mask: is_causal=True would align top-left, wrong when S > T
        mask = None if S == T else _causal_mask(T, S, device=q.device)  # (T, S), True = may attend
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=self.n_kv_heads != self.n_heads
        )  # (B, H, T, D) @ (B, H_kv, D, S) -> (B, H, T, S) -> softmax @ (B, H_kv, S, D) -> (B, H, T, D)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x (batch, seq_len, d_model) -> (batch, seq_len, d_model); cos, sin (seq_len, head_dim)."""
        B, T, _ = x.shape
        q = self.project_q(x, cos, sin)  # (B, H, T, D)
        k, v = self.project_kv(x, cos, sin)  # (B, H_kv, T, D): without a cache S == T
        out = self.attend(q, k, v)  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, H, T, D) -> (B, T, H*D)
        return self.o_proj(out)


class Block(nn.Module):
    """One pre-norm transformer layer: x + attention(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)  # (B, T, C): tokens read each other
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C): each token thinks on its own

    def forward_cached(self, x: torch.Tensor, cache, layer: int, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> torch.Tensor:
        """The same layer for new tokens only, attending through the KV cache (notebook 04)."""
        from kvlib.kv_cache import cached_attention  # the learner's Exercise 4.2

        x = x + cached_attention(self.attn, self.attn_norm(x), cache, layer, rope_cos, rope_sin)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Token ids (batch, seq_len) -> next-token logits (batch, seq_len, vocab_size), float32.

    Example: Decoder(ModelConfig(vocab_size=10))(torch.tensor([[1, 2, 3]])).shape -> (1, 3, 10)
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # untied, as in Llama
        cos, sin = rotary_tables(config.head_dim, config.max_seq_len, config.rope_theta)
        # buffers follow .to(device) but stay out of the state dict: they are computed, not learned
        self.register_buffer("rope_cos", cos, persistent=False)  # (max_seq_len, D)
        self.register_buffer("rope_sin", sin, persistent=False)

    def check_input(self, input_ids: torch.Tensor, pos: int = 0) -> None:
        """Raise ValueError, naming expected and actual, unless input_ids is a valid (B, T) batch at pos."""
        if not isinstance(input_ids, torch.Tensor):
            kind = type(input_ids).__name__
            raise ValueError(f"input_ids must be a torch.LongTensor of shape (batch, seq_len), got a {kind}")
        if input_ids.dim() != 2:
            raise ValueError(
                f"input_ids must have shape (batch, seq_len), got shape {tuple(input_ids.shape)}; "
                "for one prompt use ids[None] or torch.tensor([ids])"
            )
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}")
        B, T = input_ids.shape
        if T == 0:
            raise ValueError(f"input_ids has shape {(B, T)}: an empty prompt gives nothing to predict from")
        if isinstance(pos, bool) or not isinstance(pos, int) or pos < 0:
            raise ValueError(f"pos must be a non-negative int (the first token's absolute position), got {pos!r}")
        if pos + T > self.config.max_seq_len:
            raise ValueError(
                f"positions {pos}..{pos + T - 1} run past max_seq_len={self.config.max_seq_len} "
                f"(input_ids shape {(B, T)}, pos={pos})"
            )
        if input_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # the range check reads ids back to the host, which a CUDA graph capture cannot do
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got values {low} to {high}")

    def forward(self, input_ids: torch.Tensor, pos: int = 0, past_key_values=None):
        """Logits for every position; token i of each row sits at absolute position pos + i.

        With past_key_values (a kvlib.kv_cache.KVCache), as in the seed's pseudo-code: only the
        new tokens run, at positions cache.pos + i, against every cached key; the cache grows by
        seq_len and (logits, cache) is returned.
        """
        if past_key_values is not None:
            cache = past_key_values
            self.check_input(input_ids, cache.pos)
            x = self.embed(input_ids.long())  # (B, T) -> (B, T, C), new tokens only
            for i, layer in enumerate(self.layers):
                x = layer.forward_cached(x, cache, i, self.rope_cos, self.rope_sin)  # (B, T, C)
            cache.advance(input_ids.shape[1])  # every layer has written its T new keys and values
            return self.lm_head(self.norm(x)).float(), cache
        self.check_input(input_ids, pos)
        T = input_ids.shape[1]
        cos, sin = self.rope_cos[pos : pos + T], self.rope_sin[pos : pos + T]  # (max_seq_len, D) -> (T, D)
        x = self.embed(input_ids.long())  # (B, T) -> (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)  # (B, T, C) -> (B, T, C)
        return self.lm_head(self.norm(x)).float()  # (B, T, C) -> (B, T, vocab_size)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ---------------------------------------------------------------------------------------------
# Loading weights: a state dict with checks, transformers' Llama, the shipped tiny model


class SlowDecoder(Decoder):
    """A Decoder whose forward also sleeps `per_token` seconds per input token, so that the time of
    a prefill or a step is known in advance: the checks of Exercise 2.3 time it."""

    def __init__(self, config: ModelConfig, per_token: float = 0.004):
        super().__init__(config)
        self.per_token = float(per_token)

    def forward(self, input_ids: torch.Tensor, pos: int = 0, past_key_values=None):
        import time

        time.sleep(self.per_token * input_ids.shape[1])
        return super().forward(input_ids, pos, past_key_values)


def load_checked(model: nn.Module, state_dict: dict, source: str = "state dict") -> nn.Module:
    """Copy state_dict into model (casting to the model's dtype); ValueError naming any
    missing, unexpected or wrong-shaped parameter, with the expected and actual shape."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{source} does not fit the model: missing {missing[:6]}, unexpected {unexpected[:6]}")
    for name, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(
                f"{source}: parameter {name!r} has shape {tuple(tensor.shape)}, "
                f"expected {tuple(expected[name].shape)}"
            )
    with torch.no_grad():
        for name, param in model.state_dict().items():
            param.copy_(state_dict[name])  # copy_ casts, e.g. float16 on disk -> float32 in memory
    return model


def _hf_name(name: str) -> str:
    """The transformers Llama name of one of our parameters.

    Example: _hf_name("layers.0.attn.q_proj.weight") -> "model.layers.0.self_attn.q_proj.weight"
    """
    if name in ("embed.weight", "norm.weight"):
        return {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}[name]
    if name == "lm_head.weight":
        return name
    name = name.replace(".attn_norm.", ".input_layernorm.").replace(".mlp_norm.", ".post_attention_layernorm.")
    return "model." + name.replace(".attn.", ".self_attn.")


def config_from_transformers(hf_config) -> ModelConfig:
    """Our ModelConfig for a transformers LlamaConfig; ValueError for features we do not model."""
    rope = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", getattr(hf_config, "rope_theta", None))
    n_heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // n_heads
    problems = []
    if rope_type != "default":
        problems.append(f"rope type {rope_type!r} (only 'default' is modelled)")
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        problems.append(f"activation {hf_config.hidden_act!r} (SwiGLU needs 'silu')")
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        problems.append("bias in attention or MLP projections")
    if head_dim * n_heads != hf_config.hidden_size:
        problems.append(f"head_dim {head_dim} != hidden_size / num_attention_heads")
    if theta is None:
        problems.append("no rope_theta")
    if problems:
        raise ValueError("cannot convert this Llama config: " + "; ".join(problems))
    return ModelConfig(
        vocab_size=hf_config.vocab_size,
        d_model=hf_config.hidden_size,
        n_layers=hf_config.num_hidden_layers,
        n_heads=n_heads,
        n_kv_heads=getattr(hf_config, "num_key_value_heads", None) or n_heads,
        hidden_dim=hf_config.intermediate_size,
        max_seq_len=hf_config.max_position_embeddings,
        rope_theta=float(theta),
        norm_eps=hf_config.rms_norm_eps,
    )


def from_transformers(hf_model) -> Decoder:
    """A Decoder holding the weights of a transformers LlamaForCausalLM (float32, eval mode).

    Same architecture, renamed parameters (see _hf_name); a wrong-shaped weight raises
    ValueError naming the parameter, the expected and the actual shape.
    """
    config = config_from_transformers(hf_model.config)
    model = Decoder(config)
    theirs = {k: v for k, v in hf_model.state_dict().items() if not k.endswith("rotary_emb.inv_freq")}
    if "lm_head.weight" not in theirs:  # tied embeddings: the output layer reuses the input one
        theirs["lm_head.weight"] = hf_model.get_output_embeddings().weight
    converted = {}
    for name in model.state_dict():
        if _hf_name(name) not in theirs:
            raise ValueError(f"the transformers model has no {_hf_name(name)!r} (for our {name!r})")
        converted[name] = theirs.pop(_hf_name(name))
    if theirs:
        raise ValueError(f"transformers weights with no place in the Decoder: {sorted(theirs)[:6]}")
    load_checked(model, converted, source="transformers weights")
    return model.float().eval()


def to_transformers(model: Decoder):
    """A transformers LlamaForCausalLM with the same weights (float32, eval mode): the inverse of
    from_transformers, so that kvlib can be compared with transformers on identical weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.hidden_dim,
        num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, rope_theta=c.rope_theta,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # no special tokens: generate never stops early
    )
    hf_model = LlamaForCausalLM(hf_config)
    hf_model.generation_config.eos_token_id = hf_model.generation_config.bos_token_id = None
    state = {_hf_name(name): tensor for name, tensor in model.state_dict().items()}
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(f"weights do not map onto transformers' Llama: missing {missing[:6]}, unexpected {unexpected[:6]}")
    return hf_model.float().eval()


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_tiny(path: str | Path | None = None) -> tuple[Decoder, Tokenizer]:
    """The trained tiny model (float32, eval mode) and its tokenizer, from assets/tiny.

    Checks the weights' sha256 against manifest.json first. The files are written by
    `python -m kvlib.train`, which reproduces them.
    """
    folder = Path(path) if path is not None else TINY_DIR
    command = "python -m kvlib.train" + ("" if folder.resolve() == TINY_DIR else f" --out {folder}")
    files = [folder / name for name in (WEIGHTS_FILE, CONFIG_FILE, TOKENIZER_FILE, MANIFEST_FILE)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise FileNotFoundError(
            f"the tiny model's files {missing} are missing from {folder}: "
            f"run `{command}` (a few minutes on a CPU) to rebuild them"
        )
    manifest = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))
    actual = sha256_of(folder / WEIGHTS_FILE)
    if actual != manifest.get("weights_sha256"):
        raise ValueError(
            f"{folder / WEIGHTS_FILE} is corrupted or not the file its manifest describes "
            f"(sha256 {actual[:12]}..., manifest says {str(manifest.get('weights_sha256'))[:12]}...): "
            f"restore it with `git checkout -- {folder}`, or rebuild it with `{command} --force`"
        )
    config = ModelConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text(encoding="utf-8")))
    tokenizer = Tokenizer.load(folder / TOKENIZER_FILE)
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens, config says vocab_size={config.vocab_size}")
    state_dict = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    model = load_checked(Decoder(config), state_dict, source=str(folder / WEIGHTS_FILE))
    return model.float().eval(), tokenizer
