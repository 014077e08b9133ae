"""A list whose items arrive one at a time, as they are read: how notebook 09's online softmax is handed its chunks
when its memory is checked (kvlib.checks.fused), locally and in the isolated grader (kvlib.grading._child, where each
item comes from the grading process). Nothing of an item exists until it is read, so what a call holds at once is
what it keeps. Not here: what is measured.
"""

from __future__ import annotations

from collections.abc import Callable


class Stream(list):
    """read(i) -> item i, called each time the item is read; a list to isinstance and to len, indexing, slicing
    (a slice stays a Stream: nothing is read yet), iteration in either order and `in`."""

    def __init__(self, read: Callable[[int], object], indices: range):
        super().__init__()
        self._read, self._indices = read, indices

    def __len__(self) -> int:
        return len(self._indices)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Stream(self._read, self._indices[i])
        return self._read(self._indices[i])

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __reversed__(self):
        return (self[i] for i in reversed(range(len(self))))

    def __contains__(self, value) -> bool:
        return any(item is value for item in self)

    def copy(self) -> list:
        return list(self)

    def __add__(self, other) -> list:
        return list(self) + list(other)

    def __repr__(self) -> str:
        return f"<{len(self)} items, each read when it is used>"


__all__ = ["Stream"]
