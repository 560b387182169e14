"""Prompt data for PPO and GRPO: prompt texts (files or synthetic), tokenised once, and the
left-padded prompt batches that generation takes.

Files are JSONL or Parquet with a string field `prompt` (an `answer` field, if present, is
kept for reward functions that want it). Synthetic prompts (format 'synthetic') are seeded
random strings of capital letters and digits of mixed lengths: they carry no hint of the toy
task's target (lowercase letters, see rewards.target_pattern), so a rising reward is learned,
not copied.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import torch

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.preferences import data_files
from rlkube.runtime.data.tokenizer import Tokenizer

_SYNTHETIC_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "


@dataclass
class PromptData:
    texts: list[str]
    ids: list[list[int]]  # bos + prompt tokens, cut from the left to fit
    answers: list[str | None]

    def __len__(self) -> int:
        return len(self.texts)


def synthetic_prompts(num: int, seed: int, min_len: int = 4, max_len: int = 16) -> list[str]:
    rng = random.Random(seed * 7919 + 17)
    return [
        "".join(rng.choice(_SYNTHETIC_ALPHABET) for _ in range(rng.randint(min_len, max_len))) + ":"
        for _ in range(num)
    ]


def _read(spec: DataSpec) -> tuple[list[str], list[str | None]]:
    texts: list[str] = []
    answers: list[str | None] = []
    for file in data_files(spec.source, spec.format):
        if spec.format == "jsonl":
            with file.open(encoding="utf-8") as f:
                rows = []
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            rows.append((f"{file}:{n}", json.loads(line)))
                        except json.JSONDecodeError as e:
                            raise ValueError(f"data.source: {file}:{n}: not JSON ({e.msg})") from None
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(file).to_pylist()
            rows = [(f"{file} row {n}", obj) for n, obj in enumerate(table)]
        for where, obj in rows:
            if not isinstance(obj.get("prompt"), str):
                raise ValueError(f"data.source: {where}: field 'prompt' must be a string")
            texts.append(obj["prompt"])
            answer = obj.get("answer")
            answers.append(answer if isinstance(answer, str) else None)
    if not texts:
        raise ValueError("data.source: no prompts found")
    return texts, answers


def load_prompt_data(spec: DataSpec, tokenizer: Tokenizer, max_new_tokens: int) -> PromptData:
    """Prompts of `spec`, each cut from the left so prompt + completion fit in maxSeqLen."""
    room = spec.max_seq_len - max_new_tokens - 1  # - bos
    if room < 1:
        raise ValueError(
            f"data.maxSeqLen: {spec.max_seq_len} leaves no room for a prompt next to "
            f"rollout.maxNewTokens={max_new_tokens}"
        )
    if spec.format == "synthetic":
        texts = synthetic_prompts(spec.num_samples, spec.seed, max_len=max(4, min(16, room - 1)))
        answers: list[str | None] = [None] * len(texts)
    else:
        texts, answers = _read(spec)
    ids = [[tokenizer.bos_id] + tokenizer.encode(t)[-room:] for t in texts]
    return PromptData(texts=texts, ids=ids, answers=answers)


def left_padded(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, P] with every row right-aligned; P = `width` or the longest row."""
    width = max([len(r) for r in rows] + [width or 0])
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids, mask
