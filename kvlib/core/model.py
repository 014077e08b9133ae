"""The tiny Llama-style decoder that runs the course from notebook 02 on.

RMSNorm, rotary position embeddings, a SwiGLU MLP and attention in which n_heads query heads
share n_kv_heads key/value heads, so GQA (notebook 06) is a config change. The forward pass is
written once: with a cache (one that keeps the contract of kvlib.core.cache, such as notebook 04's
KVCache) only the new tokens run, and the attention through the cache is a parameter, so nothing here
imports a learner's module. Weights load with kvlib.core.weights.
Left out on purpose: the cache itself, generation and sampling (notebook 02), dropout, padding
masks, rope scaling.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

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


def matrix_params(config: ModelConfig) -> int:
    """Weights in the matrices one token is multiplied by: what a decode step reads once each (the embedding is a
    lookup of one row, the norms are tiny). Computed from the config alone: Exercise 2.8 predicts it part by part.
    """
    C, D, H, H_kv = config.d_model, config.head_dim, config.n_heads, config.n_kv_heads
    layer = C * (H + H_kv) * D * 2 + 3 * C * config.hidden_dim
    return config.n_layers * layer + C * config.vocab_size


def num_params(config: ModelConfig) -> int:
    """Every parameter of a Decoder of this config, from the config alone (none built).

    Example: num_params(config) == Decoder(config).num_params()
    """
    return matrix_params(config) + (config.vocab_size + 2 * config.n_layers + 1) * config.d_model


PARTS = ("embedding", "attention", "mlp", "norms", "lm_head")  # where a Decoder's parameters sit (Exercise 2.8)


def counted_params(model: nn.Module) -> dict[str, int]:
    """A built Decoder's parameters counted by name, part by part: what Exercise 2.8 predicts from a config.

    Example: sum(counted_params(model).values()) == model.num_params()
    """
    counted = dict.fromkeys(PARTS, 0)
    for name, p in model.named_parameters():
        top, *rest = name.split(".")
        inner = rest[1] if top == "layers" else top  # layers.<i>.<attn_norm | attn | mlp_norm | mlp>.<...>
        part = {"embed": "embedding", "lm_head": "lm_head", "attn": "attention", "mlp": "mlp"}.get(inner, "norms")
        counted[part] += p.numel()
    return counted


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


def causal_mask_tensor(seq_len: int, kv_len: int, device=None) -> torch.Tensor:
    """Boolean (seq_len, kv_len) causal mask, True where query i may attend to key j, the queries being the last
    seq_len of kv_len positions: a torch tensor for the infrastructure (notebooks 04 on), on `device`.
    """
    i = torch.arange(seq_len, device=device)[:, None]  # (T, 1)
    j = torch.arange(kv_len, device=device)[None, :]  # (1, S)
    return j <= i + (kv_len - seq_len)  # (T, S)


# ---------------------------------------------------------------------------------------------
# Layers


class RMSNorm(nn.Module):
    """RMSNorm over the last axis, with a learned scale per feature (Exercise 2.5 writes it); x's dtype out."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class MLP(nn.Module):
    """Llama's gated MLP (SwiGLU, Exercise 2.6): d_model -> hidden_dim -> d_model, each token on its own."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.hidden_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.hidden_dim, bias=False)
        self.down_proj = nn.Linear(config.hidden_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Attention(nn.Module):
    """Causal attention: n_heads query heads share n_kv_heads key/value heads (MHA, GQA or MQA).

    x (batch, seq_len, d_model) -> the same shape (forward); its parts are methods of their own.
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
        """Keys and values (batch, n_kv_heads, seq_len, head_dim) of x; keys rotated, values not."""
        (B, T, _), H_kv, D = x.shape, self.n_kv_heads, self.head_dim
        k = self.k_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        v = self.v_proj(x).view(B, T, H_kv, D).transpose(1, 2)  # (B, T, H_kv*D) -> (B, H_kv, T, D)
        return apply_rotary(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention of queries q (B, H, T, D) over keys and values k, v (B, H_kv, S, D), S >= T.

        Returns (B, H, T, D). Closed while Exercise 4.2 is checked.
        """
        T, S = q.shape[-2], k.shape[-2]
        assert (q.shape[1], k.shape[1]) == (self.n_heads, self.n_kv_heads), f"q {tuple(q.shape)}, k {tuple(k.shape)}"
        assert S >= T, f"{T} queries need at least {T} keys, got {S}"
        # an explicit bottom-right mask: is_causal=True would align top-left, wrong when S > T
        mask = None if S == T else causal_mask_tensor(T, S, device=q.device)  # (T, S), True = may attend
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

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache=None,
        layer: int = 0,
        attention: "CacheAttention | None" = None,
    ) -> torch.Tensor:
        """x (batch, seq_len, d_model) -> the same shape.

        cos, sin: the angles of x's positions (seq_len, head_dim), or with a cache the model's whole
        rotary tables (max_seq_len, head_dim), the layer's attention then going through the cache.
        """
        h = self.attn_norm(x)
        x = x + (
            self.attn(h, cos, sin) if cache is None else attention(self.attn, h, cache, layer, cos, sin)
        )  # tokens read each other
        return x + self.mlp(self.mlp_norm(x))  # (B, T, C): each token thinks on its own


# attention(attn, x, cache, layer, rope_cos, rope_sin) -> (batch, seq_len, d_model): one layer's
# attention for the new tokens x against everything the cache holds (notebook 04's Exercise 4.2)
CacheAttention = Callable[..., torch.Tensor]


def decode_layout(module: nn.Module) -> nn.Module:
    """Store each nn.Linear weight of module in the memory order a decode step reads fastest; returns module.

    A weight keeps its shape (out_features, in_features), its values and its state dict: only the
    order of its numbers in memory changes. A decode step at batch 1 is one matrix-vector product
    per weight, so its speed is the rate at which that product streams weights, and torch's
    routine (MKL's) streams a matrix faster in one order or the other depending on its shape. On
    the CPU this course was built on, one core, weights read from memory: a matrix at least as tall
    as it is wide (out >= in: queries, keys, values, gate, up, the output head) streamed column after
    column up to 1.7x faster (GPT-2 small's 768-wide ones 1.2-1.7x, large square ones no faster),
    with W.T, which x @ W.T multiplies by, contiguous; a wide one (the MLP's down projection) had
    no steady winner (0.86-1.2x, run to run), so it stays row after row, nn.Linear's default.
    `kvlib bench memory` and notebook 05 measure both orders on yours. Engines choose their weights'
    layout when they load them, for this reason.
    """
    for m in module.modules():
        if isinstance(m, nn.Linear):
            w, tall = m.weight, m.weight.shape[0] >= m.weight.shape[1]
            if tall and w.is_contiguous():
                m.weight = nn.Parameter(w.detach().t().contiguous().t(), requires_grad=w.requires_grad)
            elif not tall and not w.is_contiguous():
                m.weight = nn.Parameter(w.detach().contiguous(), requires_grad=w.requires_grad)
    return module


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
        decode_layout(self)  # same shapes and values; the matrix-vector products of decoding run faster

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
        if torch.compiler.is_compiling():
            return  # the range check reads ids back to the host: traced, it would split torch.compile's graph
        if input_ids.is_cuda and torch.cuda.is_current_stream_capturing():
            return  # the range check reads ids back to the host, which a CUDA graph capture cannot do
        low, high = int(input_ids.min()), int(input_ids.max())
        if low < 0 or high >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size}), got values {low} to {high}")

    def forward(
        self, input_ids: torch.Tensor, pos: int = 0, past_key_values=None, attention: CacheAttention | None = None
    ):
        """Logits for every position; token i of each row sits at absolute position pos + i.

        With past_key_values, as in the interface of transformers (and the articles' pseudo-code):
        only the new tokens run, after the cache.pos tokens the cache holds, and (logits, cache) is
        returned, the cache holding the new tokens too (the contract a cache keeps: kvlib.core.cache).
        attention is how a layer reads the cache (CacheAttention); None takes the cache's own.
        """
        cache = past_key_values
        if cache is not None:
            pos, attention = cache.pos, attention or getattr(cache, "attention", None)
            if attention is None:
                raise ValueError(
                    f"a {type(cache).__name__} has no attention method: pass model(ids, past_key_values=cache, "
                    "attention=...) (how a layer attends through it, see kvlib.core.cache)"
                )
        self.check_input(input_ids, pos)
        T = input_ids.shape[1]
        if cache is None:
            cos, sin = self.rope_cos[pos : pos + T], self.rope_sin[pos : pos + T]  # (max_seq_len, D) -> (T, D)
        else:
            cos, sin = self.rope_cos, self.rope_sin  # the cache's attention slices them at cache.pos
        x = self.embed(input_ids.long())  # (B, T) -> (B, T, C): with a cache, the new tokens only
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, attention)  # (B, T, C) -> (B, T, C)
        logits = self.lm_head(self.norm(x)).float()  # (B, T, C) -> (B, T, vocab_size)
        if cache is None:
            return logits
        cache.advance(T)  # every layer has written its T new keys and values
        return logits, cache

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class SlowDecoder(Decoder):
    """A stand-in Decoder for the timing checks of Exercise 2.3: its forward costs known seconds on
    a fake clock, never real time, so what a measurement should find is known exactly.

    A forward costs `per_token` for each token it has not seen in its previous forward (the whole
    prompt in a prefill, one token in a naive decode step) plus a tenth of that for every token of
    the sequence: like a model that keeps earlier work, so that a prefill and a decode step cost
    clearly different amounts. Inside `with model.fake_clock():` time.perf_counter, monotonic and
    time (and their _ns forms) read the fake clock. In the isolated grader it stays on the grader's
    side (kvlib.checks.generation.TimedModel), where the child's clocks ask for its time (fake_clock).
    """

    START = 1000.0  # the fake clock's reading before any forward: not 0, so absolute times show

    def __init__(self, config: ModelConfig, per_token: float = 0.004):
        super().__init__(config)
        self.per_token = float(per_token)
        self.now = self.START
        self._seen: torch.Tensor | None = None

    def cost(self, seq_len: int, new: int) -> float:
        """Fake seconds of a forward over seq_len tokens of which `new` were not in the previous one."""
        return self.per_token * (new + seq_len / 10)

    def forward(self, input_ids: torch.Tensor, pos: int = 0, past_key_values=None, attention=None):
        ids, seen = input_ids.detach().cpu(), self._seen
        kept = (
            seen is not None
            and seen.shape[0] == ids.shape[0]
            and seen.shape[1] <= ids.shape[1]
            and torch.equal(ids[:, : seen.shape[1]], seen)
        )
        new = ids.shape[1] - (seen.shape[1] if kept else 0)
        self._seen = ids.clone()
        self.now += self.cost(ids.shape[1], new)
        return super().forward(input_ids, pos, past_key_values, attention)

    def fake_clock(self, *namespaces):
        """Make the time module's clocks read this model's fake clock while inside (see fake_clock)."""
        return fake_clock(lambda: self.now, *namespaces)


@contextmanager
def fake_clock(now: Callable[[], float], *namespaces):
    """Make time.perf_counter, monotonic and time (and their _ns forms) read now() while inside.

    namespaces: modules or functions whose globals imported a clock by name (from time import
    perf_counter) and should read the fake one too. The isolated grading child uses it with a clock
    that asks the grader (Exercise 2.3: the stand-in model and its clock stay on the grader's side).
    """
    seconds = {"perf_counter": now, "monotonic": now, "time": lambda: 1.7e9 + now()}
    fakes = {
        **seconds,
        **{f"{name}_ns": (lambda f: lambda: int(round(f() * 1e9)))(f) for name, f in seconds.items()},
    }
    real = {id(getattr(time, name)): fakes[name] for name in fakes}
    spaces = [vars(time)] + ([vars(sys.modules["timeit"])] if "timeit" in sys.modules else [])
    for space in namespaces:  # a module: its globals; a function, or an object holding functions: theirs
        while not callable(space) and hasattr(space, "__wrapped__"):  # a view of a module (kvlib.checks.Graded)
            space = space.__wrapped__
        if isinstance(space, type(sys)):
            spaces.append(vars(space))
            continue
        for fn in [space] if callable(space) else list(getattr(space, "__dict__", {}).values()):
            while hasattr(fn, "__wrapped__"):
                fn = fn.__wrapped__
            if hasattr(fn, "__globals__"):
                spaces.append(fn.__globals__)
    saved = []
    for space in spaces:
        for key, value in list(space.items()):
            if id(value) in real and callable(value) and not any(s is space and k == key for s, k, _ in saved):
                saved.append((space, key, value))
                space[key] = real[id(value)]
    try:
        yield
    finally:
        for space, key, value in reversed(saved):
            space[key] = value
