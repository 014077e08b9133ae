"""A character-level tokenizer: one token per character of the training corpus.

The tiny model (notebooks 02-06) reads and writes one character per step, so 巴 and 黎 are two
tokens and "法国的首都是" generates 巴, then 黎, exactly as the article narrates it. Left out on
purpose: byte-pair merges, special tokens (no BOS/EOS/padding) and unknown-character fallback.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path


class Tokenizer:
    """Maps each known character to an id (its index in `chars`) and back.

    Example: Tokenizer("ab").encode("ba") -> [1, 0]
    """

    def __init__(self, chars: Sequence[str]):
        chars = list(chars)
        if not chars:
            raise ValueError("a tokenizer needs at least one character")
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"every vocabulary entry must be one character, got {bad[:5]!r}")
        if len(set(chars)) != len(chars):
            raise ValueError("the vocabulary lists a character twice")
        self.chars = chars
        self._ids = {c: i for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str) -> "Tokenizer":
        """Build the vocabulary from a corpus: its distinct characters, sorted by code point."""
        return cls(sorted(set(text)))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, one per character. encode("") returns [] (the model refuses an
        empty prompt: there is nothing to predict from).

        Raises ValueError, listing them, on characters the training corpus never contained.
        """
        if not isinstance(text, str):
            raise TypeError(f"encode takes a str, got {type(text).__name__}")
        try:
            return [self._ids[c] for c in text]
        except KeyError:
            unknown = sorted({c for c in text if c not in self._ids})
            raise ValueError(
                f"unknown characters {''.join(unknown)!r} ({', '.join(repr(c) for c in unknown)}): "
                f"this character-level model only knows the {self.vocab_size} characters of its "
                "training corpus (country and capital names in English and Chinese, and the "
                "question templates around them)"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        """The text of a sequence of token ids (a list, or a 1-D tensor or array)."""
        if hasattr(ids, "tolist"):  # a torch tensor or a numpy array
            ids = ids.tolist()
        ids = [ids] if isinstance(ids, int) else list(ids)  # a 0-d tensor gives one int
        if any(isinstance(i, list) for i in ids):
            raise ValueError("decode takes one sequence of ids; decode each row of a batch separately")
        ids = [operator.index(i) if hasattr(i, "__index__") and not isinstance(i, bool) else i for i in ids]
        bad = [i for i in ids if type(i) is not int or not 0 <= i < self.vocab_size]  # bools are not ids
        if bad:
            raise ValueError(f"token ids must be integers in [0, {self.vocab_size}), got {bad[:5]}")
        return "".join(self.chars[i] for i in ids)

    # --- saving and loading, as JSON: {"kind": "char", "chars": [...]}

    def to_dict(self) -> dict:
        return {"kind": "char", "chars": self.chars}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), ensure_ascii=False, indent=0) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if data.get("kind") != "char" or not isinstance(data.get("chars"), list):
            raise ValueError(f"{path} is not a character-level tokenizer (expected kind 'char' and a list 'chars')")
        return cls(data["chars"])

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"
