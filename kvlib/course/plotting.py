"""The course's figures (kvlib.course.plotting): one function per figure, one style for all of them.

Each function builds one matplotlib Figure and returns it, already closed to pyplot, so a notebook
cell shows it exactly once. Okabe-Ito colours (safe for colour-blind readers), fonts sized for a
projector, titles that state the takeaway. Chinese tokens use a CJK font when one is installed,
else their pinyin (wǒ, ài), never empty boxes; so do titles and labels in Chinese (KVLIB_LANG=zh-CN), which fall
back to English without one. Not here: computing anything, or widgets.
"""

# The notebooks call plotting.<figure>: each figure lives in kvlib/course/figures/<notebook's module>.py.
from kvlib.course.figures.attention import attention_weights, causal_attention_heatmap
from kvlib.course.figures.class_grading import class_grading
from kvlib.course.figures.compress import cache_schemes
from kvlib.course.figures.fused import attention_tiles, fused_memory
from kvlib.course.figures.generation import rotary_scores, time_per_token, ttft_against_prompt_length
from kvlib.course.figures.gqa import gqa_decode_time, gqa_memory_bars, gqa_quality, kv_bytes_per_token
from kvlib.course.figures.kv_cache import cache_time_against_length, decode_step_scores
from kvlib.course.figures.memory_wall import bytes_against_kv_len, decode_against_batch, roofline
from kvlib.course.figures.recompute import naive_decode_work, step_time_fit
from kvlib.course.figures.serving import block_memory_map, serving_compare
from kvlib.course.figures.speculative import accepted_drafts, speculative_speedup
from kvlib.course.figures.style import (
    COLORS,
    MASKED_GREY,
    PALETTE,
    PINYIN,
    SEQUENTIAL_CMAP,
    cjk_font,
    missing_glyphs,
    record_note,
    style,
    to_png,
    token_label,
    translate_texts,
)

__all__ = [
    "COLORS",
    "MASKED_GREY",
    "PALETTE",
    "PINYIN",
    "SEQUENTIAL_CMAP",
    "accepted_drafts",
    "attention_tiles",
    "attention_weights",
    "block_memory_map",
    "bytes_against_kv_len",
    "cache_schemes",
    "cache_time_against_length",
    "causal_attention_heatmap",
    "cjk_font",
    "class_grading",
    "decode_against_batch",
    "decode_step_scores",
    "fused_memory",
    "gqa_decode_time",
    "gqa_memory_bars",
    "gqa_quality",
    "kv_bytes_per_token",
    "missing_glyphs",
    "naive_decode_work",
    "record_note",
    "roofline",
    "rotary_scores",
    "serving_compare",
    "speculative_speedup",
    "step_time_fit",
    "style",
    "time_per_token",
    "to_png",
    "token_label",
    "translate_texts",
    "ttft_against_prompt_length",
]
