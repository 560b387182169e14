"""Tokenizers the runtime can use: rlkube's byte-level tokenizer, or a Hugging Face one from a path.

The byte tokenizer exists because no model hub is reachable from the test machines and pods:
every UTF-8 byte is one token (ids 0..255), followed by three specials (pad 256, bos 257,
eos 258), so its vocabulary has 259 entries and any model with a vocabulary at least that large
can consume its ids. It is exact and reversible, and one character of ASCII text is one token,
which makes token counts in tests and benchmarks predictable. Its chat format is plain text
(`role: content` a line, the generation prompt `assistant: `) wrapped in bos ... eos like any
other sequence, since bytes cannot spell its special tokens.

A Hugging Face tokenizer renders conversations with its own chat template, which writes the
special tokens itself (bos, turn markers, end of turn): such sequences are not wrapped again.
rlkube builds its padded tensors itself (prompts left-padded for generation, training rows
right-padded), so the tokenizer's padding side never decides anything; it is set to left so a
caller that pads with the tokenizer gets what generation needs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Protocol

from rlkube.runtime.contract.vocab import BYTE_IDS, BYTE_TOKENIZER, BYTE_VOCAB_SIZE
from rlkube.runtime.infra.errors import DataError


class Tokenizer(Protocol):
    """What the runtime needs from a tokenizer."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    # True when chat_text writes the special tokens itself (sequences are not wrapped in bos/eos)
    chat_renders_specials: bool
    # what identifies the tokenizer's behaviour, for cache keys
    fingerprint: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def chat_text(self, messages: list[dict], add_generation_prompt: bool) -> str: ...


@dataclass(frozen=True)
class ByteTokenizer:
    """256 byte tokens plus pad/bos/eos: vocabulary 259 (the contract's BYTE_VOCAB_SIZE, which
    `rlkube validate` and the CRD hold a model config's vocab_size to)."""

    vocab_size: int = BYTE_VOCAB_SIZE
    pad_id: int = BYTE_IDS
    bos_id: int = BYTE_IDS + 1
    eos_id: int = BYTE_IDS + 2
    chat_renders_specials: bool = False
    fingerprint: str = BYTE_TOKENIZER

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < BYTE_IDS).decode("utf-8", errors="replace")

    def chat_text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
        return text + ("assistant: " if add_generation_prompt else "")


class PretrainedTokenizer:
    """A Hugging Face tokenizer loaded with AutoTokenizer.from_pretrained(path), local files only."""

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        self.path = path
        self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self._tok.padding_side = "left"
        self.chat_renders_specials = True
        self.vocab_size = len(self._tok)
        eos = self._tok.eos_token_id
        if eos is None:
            raise DataError(f"model.tokenizer: tokenizer at {path!r} has no eos token")
        self.eos_id = int(eos)
        # Many causal-LM tokenizers have no pad or bos token; pad positions are always masked out,
        # so reusing eos there is safe.
        self.pad_id = int(self._tok.pad_token_id if self._tok.pad_token_id is not None else eos)
        self.bos_id = int(self._tok.bos_token_id if self._tok.bos_token_id is not None else eos)
        ident = [path, self.vocab_size, self.pad_id, self.bos_id, self.eos_id, self._tok.chat_template]
        self.fingerprint = hashlib.sha256(json.dumps(ident, default=str).encode()).hexdigest()[:16]

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def chat_text(self, messages: list[dict], add_generation_prompt: bool) -> str:
        if not self._tok.chat_template:
            raise DataError(
                f"model.tokenizer: the tokenizer at {self.path!r} has no chat template, which "
                "conversational data needs (set chat_template in its tokenizer_config.json, or give "
                "prompt/chosen/rejected as plain strings)"
            )
        return self._tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def load_tokenizer(name: str) -> Tokenizer:
    """'byte' -> ByteTokenizer; anything else is a tokenizer directory."""
    if name == BYTE_TOKENIZER:
        return ByteTokenizer()
    return PretrainedTokenizer(name)
