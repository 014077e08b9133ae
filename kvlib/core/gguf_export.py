"""A kvlib Decoder written as a GGUF file, the format llama.cpp reads, with the `gguf` package.

`kvlib bench cache` runs llama.cpp (through llama-cpp-python) on the very weights kvlib runs, so
the comparison is engine against engine, not model against model. Optional: `pip install -e
".[peers]"` brings `gguf` and `llama-cpp-python`.

Two things differ from kvlib's layout (both as llama.cpp's own convert_hf_to_gguf.py does them for
a Llama, github.com/ggml-org/llama.cpp):
  * rotary pairs: kvlib (like transformers) turns feature i with feature i + head_dim/2 ("rotate
    half"); llama.cpp's Llama turns neighbours 2i and 2i+1. Reordering the output rows of q_proj
    and k_proj within each head (`rotary_interleave`) turns one convention into the other; the
    scores q.k are unchanged, since both q and k are reordered alike.
  * names: blk.N.attn_q.weight for layers.N.attn.q_proj.weight, and so on (GGUF_NAMES).
Matrices are stored as torch keeps them, (out_features, in_features); GGUF lists the dimensions
the other way round, which the writer does itself.
No tokenizer: llama.cpp needs a vocabulary, so each token id gets a placeholder piece ("<t17>");
the benchmark feeds token ids, never text.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kvlib.core.model import Decoder

# kvlib parameter name (layer index as {i}) -> GGUF tensor name, for llama.cpp's "llama" architecture
GGUF_NAMES = {
    "embed.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "layers.{i}.attn_norm.weight": "blk.{i}.attn_norm.weight",
    "layers.{i}.attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "layers.{i}.attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "layers.{i}.attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "layers.{i}.attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "layers.{i}.mlp_norm.weight": "blk.{i}.ffn_norm.weight",
    "layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}

WEIGHT_TYPES = ("F32", "Q8_0")  # Q8_0: blocks of 32 int8 weights sharing one float16 scale (34 bytes per 32)


def gguf_name(name: str) -> str:
    """The GGUF tensor name of one of our parameters. Example: "layers.3.mlp.up_proj.weight" -> "blk.3.ffn_up.weight"."""
    parts = name.split(".")
    if parts[0] == "layers":
        key = ".".join(["layers", "{i}", *parts[2:]])
        if key in GGUF_NAMES:
            return GGUF_NAMES[key].format(i=parts[1])
    elif name in GGUF_NAMES:
        return GGUF_NAMES[name]
    raise ValueError(f"no GGUF name for parameter {name!r}")


def rotary_interleave(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q_proj or k_proj's rows reordered from rotate-half pairs (i, i + D/2) to neighbour pairs (2i, 2i + 1).

    weight: (n_heads * head_dim, d_model), n_heads the heads this projection makes (n_kv_heads
    for k_proj). Within each head, rows [0..D/2) and [D/2..D) are interleaved: new row 2i is old
    row i, new row 2i + 1 is old row i + D/2. (llama.cpp's converter calls this `permute`.)
    """
    rows, cols = weight.shape
    if rows % (2 * n_heads):
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of an even head_dim")
    half = rows // n_heads // 2
    return weight.reshape(n_heads, 2, half, cols).transpose(1, 2).reshape(rows, cols)


def write_gguf(model: Decoder, path: str | Path, weight_type: str = "F32") -> Path:
    """Write model to path as a llama.cpp GGUF file; weight_type "F32" or "Q8_0" (the matrices; norms stay F32).

    Returns the path. Needs the `gguf` package (the peers extra).
    """
    if weight_type not in WEIGHT_TYPES:
        raise ValueError(f"weight_type must be one of {WEIGHT_TYPES}, got {weight_type!r}")
    try:
        import gguf  # noqa: PLC0415 (optional dependency: gguf, in the peers extra)
    except ImportError as err:
        raise ImportError('writing GGUF needs the gguf package: pip install -e ".[peers]"') from err
    c, path = model.config, Path(path)
    qtype = getattr(gguf.GGMLQuantizationType, weight_type)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("kvlib decoder")
    writer.add_context_length(c.max_seq_len)
    writer.add_embedding_length(c.d_model)
    writer.add_block_count(c.n_layers)
    writer.add_feed_forward_length(c.hidden_dim)
    writer.add_head_count(c.n_heads)
    writer.add_head_count_kv(c.n_kv_heads)
    writer.add_rope_dimension_count(c.head_dim)
    writer.add_rope_freq_base(float(c.rope_theta))
    writer.add_layer_norm_rms_eps(float(c.norm_eps))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if weight_type == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    # a placeholder vocabulary of the right size ("llama": sentencepiece-style, which needs no merges)
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"<t{i}>" for i in range(c.vocab_size)])
    writer.add_token_scores([0.0] * c.vocab_size)
    writer.add_token_types([int(gguf.TokenType.NORMAL)] * c.vocab_size)
    for name, tensor in model.state_dict().items():
        w = tensor.detach().float().cpu()
        if name.endswith("attn.q_proj.weight"):
            w = rotary_interleave(w, c.n_heads)
        elif name.endswith("attn.k_proj.weight"):
            w = rotary_interleave(w, c.n_kv_heads)
        data = np.ascontiguousarray(w.numpy(), dtype=np.float32)  # rows in memory, as GGUF stores them
        if weight_type == "F32" or data.ndim == 1:  # norms stay float32, as llama.cpp's converter keeps them
            writer.add_tensor(gguf_name(name), data)
        else:
            writer.add_tensor(gguf_name(name), gguf.quants.quantize(data, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
