"""How many operations a forward pass hands to torch: the aten calls behind its fixed cost per step.

Notebook 03 counts them to say what a forward costs before any arithmetic: every call is a dispatch
through Python and torch's operator machinery, whatever the size of its tensors. Counted with a
TorchDispatchMode (the mechanism torch.utils.flop_counter uses), which sees each operator once, at
the level torch dispatches it: `linear` counts once, not as its inner `mm`. Not here: FLOPs (kvlib.core.flops).
"""

from __future__ import annotations

from collections import Counter

import torch

from kvlib.core.flops import PlainDispatchMode


class _CountCalls(PlainDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func.overloadpacket).removeprefix("aten.")] += 1
        return func(*args, **(kwargs or {}))


def aten_calls(fn, *args, **kwargs) -> Counter:
    """The aten operators fn(*args, **kwargs) dispatches, by name, run under torch.inference_mode.

    Example: sum(aten_calls(model, ids).values()) -> the number of operator calls of one forward.
    """
    counter = _CountCalls()
    with torch.inference_mode(), counter:
        fn(*args, **kwargs)
    return counter.calls
