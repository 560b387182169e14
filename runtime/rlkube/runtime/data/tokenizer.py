"""Tokenizers the runtime can use: rlkube's byte-level tokenizer, or a Hugging Face one from a path.

The byte tokenizer exists because no model hub is reachable from the test machines and pods:
every UTF-8 byte is one token (ids 0..255), followed by three specials (pad 256, bos 257,
eos 258), so its vocabulary has 259 entries and any model with a vocabulary at least that large
can consume its ids. It is exact and reversible, and one character of ASCII text is one token,
which makes token counts in tests and benchmarks predictable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Tokenizer(Protocol):
    """What the runtime needs from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """256 byte tokens plus pad/bos/eos: vocabulary 259."""

    vocab_size: int = 259
    pad_id: int = 256
    bos_id: int = 257
    eos_id: int = 258

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


class PretrainedTokenizer:
    """A Hugging Face tokenizer loaded with AutoTokenizer.from_pretrained(path), local files only."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.vocab_size = len(self._tok)
        eos = self._tok.eos_token_id
        if eos is None:
            raise ValueError(f"model.tokenizer: tokenizer at {path!r} has no eos token")
        self.eos_id = int(eos)
        # Many causal-LM tokenizers have no pad or bos token; pad positions are always masked out,
        # so reusing eos there is safe.
        self.pad_id = int(self._tok.pad_token_id if self._tok.pad_token_id is not None else eos)
        self.bos_id = int(self._tok.bos_token_id if self._tok.bos_token_id is not None else eos)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)


def load_tokenizer(name: str) -> Tokenizer:
    """'byte' -> ByteTokenizer; anything else is a tokenizer directory."""
    if name == "byte":
        return ByteTokenizer()
    return PretrainedTokenizer(name)
