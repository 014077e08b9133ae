"""The peers of `kvlib bench cache`: kvlib's GGUF writer and llama.cpp running kvlib's weights.

The llama.cpp tests need the peers extra (pip install -e ".[peers]"); they skip without it, except
where KVLIB_PEERS_TEST=required (CI), where a missing llama.cpp fails them.
"""

import importlib
import os

import pytest
import torch

from kvlib.core.gguf_export import gguf_name, rotary_interleave, write_gguf
from kvlib.core.model import Decoder, ModelConfig


def _need(module: str):
    if os.environ.get("KVLIB_PEERS_TEST") == "required":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason='the peers extra is not installed (pip install -e ".[peers]")')


def _small(n_kv_heads: int = 2, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, hidden_dim=96, max_seq_len=64
    )
    return Decoder(config).eval()


def _interleaved_rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """llama.cpp's rotary for a Llama: neighbour pairs (2i, 2i + 1) turned by position * theta^(-2i/D). x (B, H, T, D)."""
    D, T = x.shape[-1], x.shape[-2]
    angle = torch.arange(T).float()[:, None] * theta ** (-torch.arange(0, D, 2).float() / D)  # (T, D/2)
    cos, sin = angle.cos(), angle.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def test_rotary_interleave_turns_rotate_half_into_neighbour_pairs_with_the_same_scores():
    """Check that q.k scores are unchanged when q_proj and k_proj rows are interleaved and the rotary turns neighbours."""
    model = _small(n_kv_heads=2)
    attn, c = model.layers[0].attn, model.config
    x = torch.randn(1, 7, c.d_model)
    B, T, H, H_kv, D = 1, 7, c.n_heads, c.n_kv_heads, c.head_dim
    with torch.no_grad():
        cos, sin = model.rope_cos[:T], model.rope_sin[:T]
        q, k = attn.project_q(x, cos, sin), attn.project_kv(x, cos, sin)[0]  # kvlib: rotate-half pairs
        q2 = _interleaved_rotary(
            (x @ rotary_interleave(attn.q_proj.weight, H).T).view(B, T, H, D).transpose(1, 2), c.rope_theta
        )
        k2 = _interleaved_rotary(
            (x @ rotary_interleave(attn.k_proj.weight, H_kv).T).view(B, T, H_kv, D).transpose(1, 2), c.rope_theta
        )
    group = H // H_kv
    scores = q @ k.repeat_interleave(group, dim=1).transpose(-1, -2)
    scores2 = q2 @ k2.repeat_interleave(group, dim=1).transpose(-1, -2)
    assert torch.allclose(scores, scores2, atol=1e-5)
    assert not torch.allclose(q, q2, atol=1e-3)  # the vectors themselves differ: only their products agree


def test_rotary_interleave_rejects_an_odd_split():
    """Check that rotary_interleave refuses, naming the head count, rows that do not split into its heads."""
    with pytest.raises(ValueError, match="do not split into 3 heads"):
        rotary_interleave(torch.zeros(8, 4), 3)


def test_gguf_names_follow_llama_cpp():
    """Check that a layer's weights and the model's own get llama.cpp's GGUF names, and an unknown one a clear
    error."""
    assert gguf_name("layers.3.attn.q_proj.weight") == "blk.3.attn_q.weight"
    assert gguf_name("layers.0.mlp.down_proj.weight") == "blk.0.ffn_down.weight"
    assert gguf_name("embed.weight") == "token_embd.weight" and gguf_name("lm_head.weight") == "output.weight"
    with pytest.raises(ValueError, match="no GGUF name"):
        gguf_name("layers.0.attn.bias")
    with pytest.raises(ValueError, match="weight_type must be one of"):
        write_gguf(_small(), "unused.gguf", "Q4_K")


def test_write_gguf_stores_every_weight_with_llama_cpp_layout(tmp_path):
    """Check that the F32 file reads back with its metadata, every tensor under its GGUF name, q_proj rows
    interleaved."""
    gguf = _need("gguf")
    model = _small(n_kv_heads=2)
    reader = gguf.GGUFReader(write_gguf(model, tmp_path / "m.gguf"))
    tensors = {t.name: t for t in reader.tensors}
    assert set(tensors) == {gguf_name(n) for n in model.state_dict()}
    field = reader.fields["llama.attention.head_count_kv"]
    assert int(field.parts[field.data[0]][0]) == 2
    q = torch.from_numpy(tensors["blk.1.attn_q.weight"].data.copy()).reshape(model.config.d_model, model.config.d_model)
    assert torch.equal(q, rotary_interleave(model.layers[1].attn.q_proj.weight.detach(), model.config.n_heads))


@pytest.mark.parametrize("which", ["tiny", "gqa"])
def test_llama_cpp_f32_greedy_tokens_equal_kvlib(which, tmp_path):
    """Check that llama.cpp, on the GGUF file kvlib wrote, picks exactly kvlib's greedy tokens (the tiny model;
    a random GQA model, whose k_proj is interleaved over fewer heads)."""
    _need("llama_cpp")
    from kvlib.core.weights import load_tiny
    from kvlib.kv_cache import generate_cached
    from kvlib.measure.peers import LlamaCpp

    model = load_tiny()[0] if which == "tiny" else _small(n_kv_heads=2, seed=3)
    n = 40 if which == "tiny" else 24
    ids = torch.randint(0, model.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(5))
    ours = generate_cached(model, ids, n)[0, 6:].tolist()
    engine = LlamaCpp(write_gguf(model, tmp_path / "m.gguf"), n_ctx=64 if which == "gqa" else 128, threads=1)
    try:
        theirs, stamps = engine(ids, n)
        logits = engine.logits(ids[0].tolist())
    finally:
        engine.close()
    assert theirs == ours and len(stamps) == n
    with torch.inference_mode():
        assert torch.allclose(torch.from_numpy(logits), model(ids)[0, -1], atol=1e-3)


def test_llama_cpp_runs_q8_0_set_up_as_this_cpu_needs(tmp_path):
    """Check that the Q8_0 file (8-bit blocks, 34 bytes per 32 weights) is about 3.8x smaller than F32 and runs, its
    weights in the buffers decided for this CPU: plain CPU buffers where it has AMX (no AMX kernels), llama.cpp's
    defaults elsewhere. A crash here fails the test (PeerCrashed), never the worker."""
    _need("llama_cpp")
    from kvlib.measure.llama_child import extra_buffers, plain
    from kvlib.measure.peers import LlamaCpp

    model = _small(n_kv_heads=4)
    f32, q8 = write_gguf(model, tmp_path / "f32.gguf"), write_gguf(model, tmp_path / "q8.gguf", "Q8_0")
    assert 2.5 < f32.stat().st_size / q8.stat().st_size < 4.0  # metadata and float32 norms dilute the 3.76x
    engine = LlamaCpp(q8, n_ctx=64)
    try:
        tokens, _ = engine(torch.tensor([[1, 2, 3]]), 8)
    finally:
        engine.close()
    assert len(tokens) == 8 and all(0 <= t < model.config.vocab_size for t in tokens)
    assert engine.system_info.startswith("CPU :") and engine.model_buffers  # read off llama.cpp itself
    assert engine.extra_buffers == extra_buffers(engine.system_info)[0]
    if not engine.extra_buffers:
        assert plain(engine.model_buffers), engine.model_buffers
    if "AMX_INT8 = 1" in engine.system_info:
        assert "AMX" not in engine.model_buffers and not engine.extra_buffers


# llama_print_system_info()'s CPU line: this project's AMD EPYC machine (recorded 2026-12-04), and the same form with
# AMX_INT8 = 1 as llama.cpp prints it on a Sapphire Rapids Xeon (the flag as issue 43 and dspy PR 10079 quote it)
EPYC = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | "
    "AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |"
)
XEON_AMX = EPYC.replace("AVX512_BF16 = 1 |", "AVX512_BF16 = 1 | AMX_INT8 = 1 |")


def test_extra_buffers_are_off_exactly_where_the_cpu_has_amx():
    """Check the decision on recorded CPU lines: AMX present -> plain buffers, with the llama.cpp issue named;
    no AMX, or AMX_INT8 = 0 -> llama.cpp's defaults; and that the load log's buffer types are read off."""
    from kvlib.measure.llama_child import AMX_ISSUE, extra_buffers, model_buffers, plain

    on, why = extra_buffers(XEON_AMX)
    assert on is False and AMX_ISSUE in why
    assert extra_buffers(EPYC)[0] is True and extra_buffers(XEON_AMX.replace("AMX_INT8 = 1", "AMX_INT8 = 0"))[0]
    log = "load_tensors:          AMX model buffer size = 1953.78 MiB\nload_tensors:   CPU_Mapped model buffer size =  0.08 MiB\n"
    assert model_buffers(log) == ["AMX", "CPU_Mapped"] and not plain(model_buffers(log))
    assert plain(["CPU_Mapped"]) and not plain(["CPU_REPACK"])


def test_a_crashed_llama_cpp_is_an_error_that_names_the_signal(tmp_path, monkeypatch):
    """Check that a llama.cpp child that kills itself (SIGSEGV) raises PeerCrashed in the caller, naming the signal and
    the cause, at this call and the next, while the calling process (a test worker, a benchmark) lives on."""
    _need("llama_cpp")
    from kvlib.measure.peers import LlamaCpp, PeerCrashed

    monkeypatch.setenv("KVLIB_LLAMA_FAULT", "all")
    engine = LlamaCpp(write_gguf(_small(), tmp_path / "m.gguf"), n_ctx=64)
    try:
        for _ in range(2):
            with pytest.raises(
                PeerCrashed,
                match=r"crashed \(signal 11, SIGSEGV\) on this CPU during generate.*"
                r"KVLIB_LLAMA_FAULT asked for it",
            ):
                engine(torch.tensor([[1, 2, 3]]), 4)
    finally:
        engine.close()
    with pytest.raises(RuntimeError, match="Model path does not exist"):  # a Python error is an answer, not a crash
        LlamaCpp(tmp_path / "absent.gguf", n_ctx=64)
