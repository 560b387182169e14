"""Prompt data for PPO and GRPO: prompt texts (files or synthetic), tokenised once, and the
left-padded prompt batches that generation takes.

Records have a `prompt` (a string, or {role, content} messages rendered with the chat template
and its generation prompt) and optionally an `answer` kept for reward functions that want it;
data.fields maps them to other columns. A string prompt is `[bos] + prompt` cut from the left to
fit; a conversation is taken as its template renders it and is malformed when too long (see
records.py for what happens to malformed records). Synthetic prompts (format 'synthetic') are
seeded random strings of capital letters and digits of mixed lengths: they carry no hint of the
toy task's target (lowercase letters, see rewards.target_pattern), so a rising reward is
learned, not copied.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.chat import render_prompt
from rlkube.runtime.data.records import InvalidRecord, InvalidRecords, PromptRecord, each_valid, parse_prompt
from rlkube.runtime.data.sources import data_files, read_records
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.infra.errors import DataError

_SYNTHETIC_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "


@dataclass
class PromptData:
    texts: list[str]  # what reward functions see as the prompt (a conversation: its rendered text)
    ids: list[list[int]]  # bos + prompt tokens, cut from the left to fit; or the rendered conversation
    answers: list[str | None]
    skipped: int = 0  # malformed records left out (data.skipInvalid), for the trainer to report

    def __len__(self) -> int:
        return len(self.texts)


def synthetic_prompts(num: int, seed: int, min_len: int = 4, max_len: int = 16) -> list[str]:
    rng = random.Random(seed * 7919 + 17)
    return [
        "".join(rng.choice(_SYNTHETIC_ALPHABET) for _ in range(rng.randint(min_len, max_len))) + ":"
        for _ in range(num)
    ]


def _tokenise(rec: PromptRecord, tokenizer: Tokenizer, room: int, max_seq_len: int) -> tuple[str, list[int]]:
    if isinstance(rec.prompt, str):
        return rec.prompt, [tokenizer.bos_id] + tokenizer.encode(rec.prompt)[-room:]
    text, ids = render_prompt(tokenizer, rec.prompt)
    if not tokenizer.chat_renders_specials:
        ids = [tokenizer.bos_id, *ids]
    if len(ids) > room + 1:
        raise InvalidRecord(
            rec.where,
            f"is {len(ids)} tokens, more than data.maxSeqLen={max_seq_len} leaves next to "
            "rollout.maxNewTokens (conversations are not truncated)",
            "prompt",
        )
    return text, ids


def read_prompts(spec: DataSpec, tokenizer: Tokenizer, room: int) -> PromptData:
    """Prompt records of spec's files, checked and tokenised; malformed ones raise or are skipped."""
    fields = spec.fields
    raws = read_records(data_files(spec.source, spec.format), spec.format, [fields.column("prompt")],
                        [fields.column("answer")])
    invalid = InvalidRecords(spec.skip_invalid)
    shape: dict = {}

    def build(raw):
        rec = parse_prompt(raw, fields, shape)
        return (*_tokenise(rec, tokenizer, room, spec.max_seq_len), rec.answer)

    rows = list(each_valid(raws, invalid, build))
    invalid.finish("prompts")
    return PromptData(texts=[t for t, _, _ in rows], ids=[i for _, i, _ in rows],
                      answers=[a for _, _, a in rows], skipped=invalid.skipped)


def load_prompt_data(spec: DataSpec, tokenizer: Tokenizer, max_new_tokens: int) -> PromptData:
    """Prompts of `spec`, each fitted so prompt + completion fit in maxSeqLen."""
    room = spec.max_seq_len - max_new_tokens - 1  # - bos
    if room < 1:
        raise DataError(
            f"data.maxSeqLen: {spec.max_seq_len} leaves no room for a prompt next to "
            f"rollout.maxNewTokens={max_new_tokens}"
        )
    if spec.format != "synthetic":
        return read_prompts(spec, tokenizer, room)
    texts = synthetic_prompts(spec.num_samples, spec.seed, max_len=max(4, min(16, room - 1)))
    ids = [[tokenizer.bos_id] + tokenizer.encode(t)[-room:] for t in texts]
    return PromptData(texts=texts, ids=ids, answers=[None] * len(texts))


def left_padded(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, P] with every row right-aligned; P = `width` or the longest row."""
    width = max([len(r) for r in rows] + [width or 0])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask
