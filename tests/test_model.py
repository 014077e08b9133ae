"""Tests for kvlib/core/model.py (the tiny Llama-style decoder) and kvlib/core/tokenizer.py."""

import json
import math
import shutil

import pytest
import torch

from kvlib.core.model import Attention, Decoder, ModelConfig, RMSNorm, apply_rotary, rotary_tables, rotate_half
from kvlib.core.tokenizer import Tokenizer
from kvlib.core.weights import from_transformers, load_tiny
from kvlib.study import corpus

torch.set_num_threads(1)

# Distinct sizes, so a swapped axis fails: B=2, H=4, H_kv=2, T=3, S=5, D=8.
SMALL = dict(vocab_size=11, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=48, max_seq_len=16)


def small_model(seed: int = 0, **overrides) -> Decoder:
    """A random Decoder with weights large enough that attention is far from uniform."""
    torch.manual_seed(seed)
    model = Decoder(ModelConfig(**{**SMALL, **overrides})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 1.0)
    return model


def greedy(model: Decoder, tokenizer: Tokenizer, prompt: str, n: int) -> list[str]:
    """The next n characters greedy decoding adds, one per step (full recompute, test-only)."""
    ids = torch.tensor([tokenizer.encode(prompt)])  # (1, T)
    out = []
    with torch.no_grad():
        for _ in range(n):
            next_token = model(ids)[:, -1].argmax(-1, keepdim=True)  # (1, 1)
            ids = torch.cat([ids, next_token], dim=1)
            out.append(tokenizer.decode(next_token[0]))
    return out


def reference_attention(q, k, v):
    """softmax(q k^T / sqrt(D)) v with a bottom-right causal mask, K/V heads repeat_interleave'd."""
    group_size = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group_size, dim=1), v.repeat_interleave(group_size, dim=1)  # (B, H, S, D)
    T, S = q.shape[-2], k.shape[-2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    allowed = torch.arange(S)[None, :] <= torch.arange(T)[:, None] + (S - T)  # (T, S)
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return probs @ v  # (B, H, T, D)


# ---------------------------------------------------------------------------------------------
# ModelConfig


def test_model_config_derives_head_dim_and_group_size():
    """Check that head_dim = d_model // n_heads and group_size = n_heads // n_kv_heads."""
    config = ModelConfig(**SMALL)
    assert (config.head_dim, config.group_size) == (8, 2)
    assert ModelConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(n_kv_heads=3), "divisible by n_kv_heads"),
        (dict(d_model=30), "divisible by n_heads"),
        (dict(d_model=12, n_heads=4, n_kv_heads=4), "even"),
        (dict(n_layers=0), "n_layers"),
        (dict(vocab_size=2.5), "vocab_size"),
        (dict(norm_eps=0.0), "norm_eps"),
    ],
)
def test_model_config_rejects_inconsistent_sizes(bad, message):
    """Check that an impossible configuration raises ValueError naming the problem."""
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**SMALL, **bad})


# ---------------------------------------------------------------------------------------------
# RMSNorm and rotary embeddings


def test_rmsnorm_output_has_unit_rms():
    """Check that RMSNorm with unit weight gives rows of root-mean-square 1, whatever their scale."""
    x = torch.randn(2, 3, 8) * torch.tensor([0.01, 1.0, 100.0])[None, :, None]
    norm = RMSNorm(8, eps=1e-12)
    torch.testing.assert_close(norm(x).pow(2).mean(-1).sqrt(), torch.ones(2, 3))
    torch.testing.assert_close(norm(5.0 * x), norm(x))


def test_rotary_position_zero_is_identity_and_norm_is_kept():
    """Check that rotary leaves position 0 unchanged and keeps every vector's length."""
    cos, sin = rotary_tables(head_dim=8, max_seq_len=5)
    x = torch.randn(2, 4, 5, 8)  # (B, H, T, D)
    out = apply_rotary(x, cos, sin)
    torch.testing.assert_close(out[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))


def test_rotary_scores_depend_only_on_relative_position():
    """Check that q.k after rotary at positions (m, n) equals that at (m + s, n + s)."""
    cos, sin = rotary_tables(head_dim=8, max_seq_len=64)
    q, k = torch.randn(8), torch.randn(8)

    def score(m, n):
        return (
            apply_rotary(q[None], cos[m : m + 1], sin[m : m + 1])
            * apply_rotary(k[None], cos[n : n + 1], sin[n : n + 1])
        ).sum()

    torch.testing.assert_close(score(7, 3), score(40, 36), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score(7, 3), score(7, 4))


def test_rotary_matches_transformers_rotate_half_convention():
    """Check that rotate_half and apply_rotary equal transformers' Llama functions."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    cos, sin = rotary_tables(head_dim=8, max_seq_len=5, theta=500.0)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    q_hf, k_hf = llama.apply_rotary_pos_emb(q, k, cos[None], sin[None])  # cos: (1, T, D)
    torch.testing.assert_close(rotate_half(q), llama.rotate_half(q))
    torch.testing.assert_close(apply_rotary(q, cos, sin), q_hf)
    torch.testing.assert_close(apply_rotary(k, cos, sin), k_hf)


# ---------------------------------------------------------------------------------------------
# Attention: GQA as a config change, and the seam for a KV cache


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_attention_attend_matches_repeat_interleave_reference(n_kv_heads):
    """Check that attend() equals softmax attention with K/V heads repeat_interleave'd (MHA, GQA, MQA)."""
    attn = Attention(ModelConfig(**{**SMALL, "n_kv_heads": n_kv_heads}))
    q = torch.randn(2, 4, 3, 8)  # (B, H, T, D)
    k, v = torch.randn(2, n_kv_heads, 5, 8), torch.randn(2, n_kv_heads, 5, 8)  # (B, H_kv, S, D)
    torch.testing.assert_close(attn.attend(q, k, v), reference_attention(q, k, v))


def test_gqa_decoder_equals_mha_decoder_with_repeated_kv_weights():
    """Check that GQA is a pure config change: an MHA model whose K/V heads are copies per group
    (repeat_interleave on the head axis) gives the same logits as the GQA model."""
    gqa = small_model(n_kv_heads=2)
    mha = Decoder(ModelConfig(**{**SMALL, "n_kv_heads": 4})).eval()
    state = {}
    for name, w in gqa.state_dict().items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):  # (H_kv*D, C) -> (H*D, C)
            w = w.view(2, 8, 32).repeat_interleave(2, dim=0).reshape(32, 32)
        state[name] = w
    mha.load_state_dict(state)
    ids = torch.randint(0, 11, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(mha(ids), gqa(ids))


def test_attention_chunk_of_queries_matches_last_rows_of_full_attention():
    """Check that the last T queries against all S keys (a cache's view) equal the last T rows of
    full causal attention: the mask is aligned bottom-right, with absolute positions."""
    model = small_model()
    attn, cos, sin = model.layers[0].attn, model.rope_cos[:5], model.rope_sin[:5]
    x = torch.randn(2, 5, 32)  # (B, S, C)
    q = attn.project_q(x, cos, sin)
    k, v = attn.project_kv(x, cos, sin)  # (B, H_kv, S, D)
    full = attn.attend(q, k, v)  # (B, H, S, D)
    q_last = attn.project_q(x[:, 2:], cos[2:], sin[2:])  # the last 3 tokens at positions 2, 3, 4
    k_last, _ = attn.project_kv(x[:, 2:], cos[2:], sin[2:])
    torch.testing.assert_close(k_last, k[:, :, 2:])  # keys depend only on token and position
    torch.testing.assert_close(attn.attend(q_last, k, v), full[:, :, 2:])


# ---------------------------------------------------------------------------------------------
# Decoder


def test_decoder_returns_float32_logits_of_shape_batch_seq_vocab():
    """Check that logits are float32 of shape (B, T, vocab_size)."""
    logits = small_model()(torch.randint(0, 11, (2, 3)))
    assert logits.shape == (2, 3, 11) and logits.dtype == torch.float32


def test_decoder_stores_tall_weights_column_major_and_wide_ones_row_major_keeping_shapes_and_state_dict():
    """Check that decode_layout keeps (out, in) shapes and values, stores out >= in column-major and
    out < in row-major, and loads any state dict."""
    model = small_model()  # d_model 32, hidden 48: the MLP's down projection (32 x 48) is the wide one
    linears = {name: m.weight for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, w in linears.items():
        tall = w.shape[0] >= w.shape[1]
        assert (w.t().is_contiguous() and not w.is_contiguous()) if tall else w.is_contiguous(), name
    assert not linears["layers.0.attn.q_proj"].is_contiguous() and linears["layers.0.mlp.down_proj"].is_contiguous()
    assert model.lm_head.weight.shape == (11, model.config.d_model)
    state = {k: v.contiguous() for k, v in small_model(seed=1).state_dict().items()}  # row-major, as nn.Linear keeps it
    model.load_state_dict(state)
    q = model.layers[0].attn.q_proj.weight
    assert not q.is_contiguous() and torch.equal(q, state["layers.0.attn.q_proj.weight"])
    ids = torch.randint(0, 11, (1, 5))
    row_major = small_model(seed=1)
    for m in row_major.modules():
        if isinstance(m, torch.nn.Linear):
            m.weight = torch.nn.Parameter(m.weight.detach().contiguous())
    with torch.no_grad():
        torch.testing.assert_close(model(ids), row_major(ids))


def test_decoder_is_causal():
    """Check that changing a later token never changes the logits of earlier positions."""
    model = small_model()
    ids = torch.randint(0, 11, (2, 6))
    changed = ids.clone()
    changed[:, 4] = (ids[:, 4] + 1) % 11
    with torch.no_grad():
        a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_decoder_logits_unchanged_by_shifting_all_positions():
    """Check that without a cache, starting at pos=p changes nothing: rotary only sees distances."""
    model = small_model()
    ids = torch.randint(0, 11, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids, pos=9), model(ids), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "ids, pos, message",
    [
        (torch.tensor([1, 2, 3]), 0, r"shape \(batch, seq_len\), got shape \(3,\)"),
        (torch.ones(2, 3, 1, dtype=torch.long), 0, r"got shape \(2, 3, 1\)"),
        (torch.ones(2, 3), 0, r"integer .* got dtype torch.float32"),
        (torch.ones(2, 0, dtype=torch.long), 0, r"shape \(2, 0\): an empty prompt"),
        (torch.ones(1, 10, dtype=torch.long), 7, r"past max_seq_len=16 \(input_ids shape \(1, 10\), pos=7\)"),
        (torch.tensor([[1, 11]]), 0, r"\[0, 11\), got values 1 to 11"),
        (torch.ones(1, 3, dtype=torch.long), -1, "pos must be a non-negative int"),
    ],
)
def test_decoder_rejects_bad_input_naming_the_shape(ids, pos, message):
    """Check that bad token ids raise ValueError naming the expected and actual shape or dtype."""
    with pytest.raises(ValueError, match=message):
        small_model()(ids, pos=pos)


# ---------------------------------------------------------------------------------------------
# Loading transformers' Llama


def random_llama(n_kv_heads: int):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=11,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=16,
        rope_theta=500.0,
        rms_norm_eps=1e-6,
    )
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # the default init (std 0.02) makes attention near uniform: widen it
        for p in hf.parameters():
            p.normal_(0.0, 0.3 if p.dim() == 2 else 1.0)
    return hf


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_from_transformers_matches_llama_logits(n_kv_heads):
    """Check that a random transformers Llama (MHA and GQA) and its conversion give the same logits,
    also when the tokens start at a later absolute position."""
    hf = random_llama(n_kv_heads)
    model = from_transformers(hf)
    assert model.config.n_kv_heads == n_kv_heads and model.config.rope_theta == 500.0
    assert not model.training and next(model.parameters()).dtype == torch.float32
    ids = torch.randint(0, 11, (2, 5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits)
        later = hf(ids, position_ids=torch.arange(7, 12)[None].expand(2, 5)).logits
        torch.testing.assert_close(model(ids, pos=7), later)


def test_from_transformers_rejects_wrong_shaped_weight():
    """Check that a weight of the wrong shape raises ValueError naming it, expected and actual shape."""
    hf = random_llama(2)
    hf.model.layers[1].self_attn.k_proj.weight = torch.nn.Parameter(torch.zeros(8, 32))
    with pytest.raises(ValueError, match=r"layers\.1\.attn\.k_proj\.weight.*\(8, 32\).*expected \(16, 32\)"):
        from_transformers(hf)


# ---------------------------------------------------------------------------------------------
# Tokenizer


def test_tokenizer_round_trips_and_makes_ba_li_single_tokens(tmp_path):
    """Check that decode(encode(s)) == s, that 巴 and 黎 are one token each, and save/load keeps ids."""
    tokenizer = Tokenizer.from_text(corpus.train_text())
    text = "法国的首都是巴黎。\nQ: What is the capital of France?\nA: Paris"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert len(tokenizer.encode("巴黎")) == 2 and tokenizer.encode("") == []
    tokenizer.save(tmp_path / "tok.json")
    assert Tokenizer.load(tmp_path / "tok.json").encode(text) == tokenizer.encode(text)


def test_tokenizer_unknown_characters_raise_listing_them():
    """Check that characters outside the training corpus raise ValueError that lists them."""
    tokenizer = Tokenizer.from_text("abc ")
    with pytest.raises(ValueError, match=r"'xé'.*training corpus"):
        tokenizer.encode("a béx")
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        tokenizer.decode([0, 9])


# ---------------------------------------------------------------------------------------------
# The shipped tiny model


@pytest.fixture(scope="module")
def tiny():
    return load_tiny()


def test_load_tiny_gives_float32_eval_model_matching_its_config(tiny):
    """Check that the shipped weights load (checksum verified) as a float32 model in eval mode."""
    model, tokenizer = tiny
    assert not model.training and all(p.dtype == torch.float32 for p in model.parameters())
    assert model.config.vocab_size == tokenizer.vocab_size
    assert model.config.n_kv_heads == model.config.n_heads  # shipped as MHA; notebook 06 pools to GQA


def test_tiny_model_answers_the_running_examples(tiny):
    """Check that greedy decoding of "法国的首都是" gives 巴 then 黎, and the English prompt " Paris"."""
    model, tokenizer = tiny
    assert greedy(model, tokenizer, "法国的首都是", 2) == ["巴", "黎"]
    assert "".join(greedy(model, tokenizer, "Q: What is the capital of France?\nA:", 6)) == " Paris"


def test_tiny_model_answers_after_a_preamble_that_fills_max_seq_len(tiny):
    """Check that the answer survives behind ~490 tokens of other facts, far past the 128-token
    rows of the main training phase, and that a full max_seq_len forward pass stays finite."""
    model, tokenizer = tiny
    preamble = corpus.train_text(seed=1)[: model.config.max_seq_len - 20]
    preamble = preamble[: preamble.rindex("\n") + 1]  # whole records only
    assert greedy(model, tokenizer, preamble + "法国的首都是", 2) == ["巴", "黎"]
    ids = torch.tensor([tokenizer.encode(corpus.train_text()[: model.config.max_seq_len])])  # (1, max_seq_len)
    with torch.no_grad():
        assert torch.isfinite(model(ids)).all()


def test_load_tiny_rejects_corrupted_or_missing_weights(tmp_path):
    """Check that a flipped byte fails the sha256 check, and a missing file names the training script."""
    from kvlib.core.weights import TINY_DIR

    folder = tmp_path / "tiny"
    shutil.copytree(TINY_DIR, folder)
    data = bytearray((folder / "model.pt").read_bytes())
    data[-100] ^= 0xFF
    (folder / "model.pt").write_bytes(bytes(data))
    with pytest.raises(ValueError, match="corrupted.*kvlib.study.train"):
        load_tiny(folder)
    (folder / "model.pt").unlink()
    with pytest.raises(FileNotFoundError, match="model.pt.*python -m kvlib.study.train"):
        load_tiny(folder)


def test_manifest_records_checksum_settings_and_evaluation():
    """Check that manifest.json records what produced the weights and what they measured."""
    from kvlib.core.weights import TINY_DIR

    manifest = json.loads((TINY_DIR / "manifest.json").read_text(encoding="utf-8"))
    for key in ("weights_sha256", "settings", "evaluation", "torch", "date", "threads", "train_seconds"):
        assert key in manifest
    evaluation = manifest["evaluation"]
    assert set(evaluation["accuracy"]) == {"train_en", "train_zh", "held_out_en", "held_out_zh"}
    bands = list(evaluation["train_loss_by_position"].values())  # flat: long generations stay sensible
    assert max(bands) < 2 * bands[0], f"loss climbs with position: {bands}"
