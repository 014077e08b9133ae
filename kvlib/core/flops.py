"""FLOPs counted by torch itself (torch.utils.flop_counter), the CPU attention kernel included.

torch's counter knows the GPU attention kernels, not the one a CPU runs
(`_scaled_dot_product_flash_attention_for_cpu`), which it would count as 0: it is taught here. One
home for the course's counted FLOPs: notebook 03 (a forward pass against the hand count), the
checks of notebooks 03-05 (the expected counts, from models the learner's code never sees; attention's part of a
forward, for notebook 03's prediction of its share) and of
notebook 04 (does a decode step's work grow with the prefix?), and the MLA study of notebook 08.
Not here: FLOPs by formula (the learner's exercises).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

# torch wraps the __torch_dispatch__ of every TorchDispatchMode in torch._disable_dynamo, which imports
# torch._dynamo the first time a mode sees an operator: 2.5-3.2 s on the course's machine, paid by every
# grading child whose checks count FLOPs or allocations (a third of notebook 04's isolated checks). The wrap
# matters only to torch.compile run inside the mode, which nothing here does: the course's modes skip it.


class PlainDispatchMode(TorchDispatchMode):
    """A TorchDispatchMode without torch's torch._disable_dynamo wrap (the hook torch documents for it)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False


def _unwrap_flop_counter() -> None:
    """The same for torch's own flop counter, whose mode class torch made: its wrap is told its work is done."""
    raw = getattr(flop_counter._FlopCounterMode.__torch_dispatch__, "__wrapped__", None)
    if raw is not None:
        setattr(raw, "__dynamo_disable", raw)  # torch._compile's cache of the disabled function


_unwrap_flop_counter()


def _attention_flops(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    """q @ k^T and probs @ v over the full (T, S) score matrix, for every query head: 2 FLOPs per multiply-add."""
    *batch, T, D = q_shape
    return 2 * math.prod(batch) * T * k_shape[-2] * (D + v_shape[-1])


_ATTENTION = {
    torch.ops.aten.scaled_dot_product_attention: _attention_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
}


def matmul_flops(fn: Callable, *args, **kwargs) -> int:
    """Matrix-multiply FLOPs (2 per multiply-add) of fn(*args, **kwargs), counted by torch where fn runs."""
    with FlopCounterMode(display=False, custom_mapping=_ATTENTION) as counter:
        fn(*args, **kwargs)
    return int(counter.get_total_flops())


def attention_flops_counted(model, seq_len: int, batch: int = 1) -> int:
    """The part of forward_flops_counted that attention's kernel does (q @ k^T and probs @ v), counted by torch."""
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    with torch.inference_mode(), FlopCounterMode(display=False, custom_mapping=_ATTENTION) as counter:
        model(ids)
    return int(sum(n for op, n in counter.get_flop_counts()["Global"].items() if op in _ATTENTION))  # by operator


def forward_flops_counted(model, seq_len: int, batch: int = 1) -> int:
    """Matrix-multiply FLOPs of one forward pass of model over seq_len tokens (ids 0), counted by torch."""
    ids = torch.zeros(batch, seq_len, dtype=torch.long)
    with torch.inference_mode():
        return matmul_flops(model, ids)
