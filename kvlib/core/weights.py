"""Weights for the Decoder: a checked state dict, transformers' Llama both ways, the shipped tiny model.

load_tiny() checks the weights' sha256 against assets/tiny/manifest.json before loading;
`python -m kvlib.study.train` rebuilds those files. from_transformers()/to_transformers() rename
parameters only: the architecture is the same.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import nn

from kvlib.core.model import Decoder, ModelConfig
from kvlib.core.paths import ASSETS
from kvlib.core.tokenizer import Tokenizer

TINY_DIR = ASSETS / "tiny"  # where load_tiny() looks
DRAFT_DIR = ASSETS / "draft"  # notebook 10's drafter: where load_draft() looks
WEIGHTS_FILE, CONFIG_FILE = "model.pt", "config.json"  # fp16 state dict; ModelConfig as JSON
TOKENIZER_FILE, MANIFEST_FILE = "tokenizer.json", "manifest.json"  # characters; sha256 + how it was made


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
                f"{source}: parameter {name!r} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
            )
    with torch.no_grad():
        for name, param in model.state_dict().items():
            param.copy_(state_dict[name])  # copy_ casts, e.g. float16 on disk -> float32 in memory
    return model


def first_head_of_group(w: torch.Tensor, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """A k_proj or v_proj weight (n_heads * head_dim, d_model) shrunk to n_kv_heads heads the other way the GQA paper
    (Ainslie et al., 2023) compares with mean-pooling: each group keeps the first of its heads and drops the rest.
    Returns (n_kv_heads * head_dim, d_model), a new tensor of w's dtype. Notebook 06b's study compares the two."""
    if w.dim() != 2 or n_heads < 1 or n_kv_heads < 1 or w.shape[0] % n_heads or n_heads % n_kv_heads:
        raise ValueError(
            f"first_head_of_group needs a (n_heads * head_dim, d_model) weight and n_kv_heads dividing n_heads: got "
            f"{tuple(w.shape)}, n_heads={n_heads}, n_kv_heads={n_kv_heads}"
        )
    kept = [h for h in range(n_heads) if h * n_kv_heads % n_heads == 0]  # one head in every n_heads / n_kv_heads
    return torch.cat([w.tensor_split(n_heads)[h] for h in kept])


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
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 (start-up time: transformers only for a comparison)

    c = model.config
    hf_config = LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        intermediate_size=c.hidden_dim,
        num_hidden_layers=c.n_layers,
        num_attention_heads=c.n_heads,
        num_key_value_heads=c.n_kv_heads,
        max_position_embeddings=c.max_seq_len,
        rms_norm_eps=c.norm_eps,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta},
        rope_theta=c.rope_theta,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,  # no special tokens: generate never stops early
    )
    hf_model = LlamaForCausalLM(hf_config)
    hf_model.generation_config.eos_token_id = hf_model.generation_config.bos_token_id = None
    state = {_hf_name(name): tensor for name, tensor in model.state_dict().items()}
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not m.endswith("rotary_emb.inv_freq")]
    if missing or unexpected:
        raise ValueError(
            f"weights do not map onto transformers' Llama: missing {missing[:6]}, unexpected {unexpected[:6]}"
        )
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
    `python -m kvlib.study.train`, which reproduces them.
    """
    folder = Path(path) if path is not None else TINY_DIR
    where = folder.resolve()
    command = "python -m kvlib.study.train" + (
        "" if where == TINY_DIR else " --preset draft" if where == DRAFT_DIR else f" --out {folder}"
    )
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


def load_draft(path: str | Path | None = None) -> tuple[Decoder, Tokenizer]:
    """Notebook 10's drafter (float32, eval mode) and its tokenizer, from assets/draft, checked as load_tiny checks.

    A 1-layer model of width 64 trained on the tiny model's corpus with its tokenizer, by
    `python -m kvlib.study.train --preset draft`.
    """
    return load_tiny(DRAFT_DIR if path is None else path)
