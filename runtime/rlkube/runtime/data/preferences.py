"""Preference data (prompt, chosen, rejected), tokenised once and cached.

A `PreferenceData` holds, for every pair, three token-id lists. The sequences the models see
are `[bos] + prompt + response + [eos]`; the log-probability of a response counts the response
tokens and the eos. Samples longer than maxSeqLen are cut from the left of the prompt (the end
of the prompt matters most to the response); a response that alone does not fit is cut from its
right, keeping one prompt token.

Files are JSONL (one object a line) or Parquet with string columns prompt, chosen, rejected; a
directory means all *.jsonl / *.parquet files in it, sorted by name. Tokenised data is cached
under `<outputDir>/cache/` keyed by the files' names, sizes and mtimes, the tokenizer and
maxSeqLen, so a restarted pod does not tokenise again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.synthetic import synthetic_pairs
from rlkube.runtime.data.tokenizer import Tokenizer

SPECIALS = 2  # bos + eos


@dataclass
class PreferenceData:
    """Tokenised preference pairs: prompt, chosen and rejected ids per pair (no specials)."""

    prompts: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]

    def __len__(self) -> int:
        return len(self.prompts)

    def seq_lengths(self, i: int) -> tuple[int, int]:
        """Full lengths of the chosen and rejected sequences of pair i (specials included)."""
        p = len(self.prompts[i]) + SPECIALS
        return p + len(self.chosen[i]), p + len(self.rejected[i])

    def pair_tokens(self) -> list[int]:
        """Tokens each pair costs when packed (chosen + rejected sequence)."""
        return [sum(self.seq_lengths(i)) for i in range(len(self))]

    def pair_max_len(self) -> list[int]:
        """Longer of each pair's two sequences (what a padded row costs)."""
        return [max(self.seq_lengths(i)) for i in range(len(self))]


def fit_to_length(prompt: list[int], response: list[int], max_seq_len: int) -> tuple[list[int], list[int]]:
    """Cut the prompt from the left (and if needed the response from the right) to fit."""
    room = max_seq_len - SPECIALS
    if len(prompt) + len(response) <= room:
        return prompt, response
    if len(response) > room - 1:
        response = response[: max(1, room - 1)]
    keep = max(room - len(response), 0)
    return (prompt[len(prompt) - keep :] if keep else []), response


def tokenise_pairs(rows: list[tuple[str, str, str]], tokenizer: Tokenizer, max_seq_len: int) -> PreferenceData:
    prompts, chosen, rejected = [], [], []
    for prompt_text, chosen_text, rejected_text in rows:
        p = tokenizer.encode(prompt_text)
        c = tokenizer.encode(chosen_text)
        r = tokenizer.encode(rejected_text)
        # Both sequences share one prompt, so cut it to what the longer response leaves room for.
        longer = c if len(c) >= len(r) else r
        p_fit, _ = fit_to_length(p, longer, max_seq_len)
        _, c = fit_to_length(p_fit, c, max_seq_len)
        _, r = fit_to_length(p_fit, r, max_seq_len)
        prompts.append(p_fit)
        chosen.append(c)
        rejected.append(r)
    return PreferenceData(prompts, chosen, rejected)


def data_files(source: str, fmt: str) -> list[Path]:
    path = Path(source)
    suffix = ".jsonl" if fmt == "jsonl" else ".parquet"
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == suffix)
        if not files:
            raise ValueError(f"data.source: directory {source!r} holds no *{suffix} files")
        return files
    if not path.exists():
        raise ValueError(f"data.source: {source!r} does not exist")
    return [path]


def _text(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise ValueError(f"data.source: {where}: field {key!r} must be a string, got {type(value).__name__}")
    return value


def read_rows(files: list[Path], fmt: str) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    for file in files:
        if fmt == "jsonl":
            with file.open(encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise ValueError(f"data.source: {file}:{n}: not JSON ({e.msg})") from None
                    where = f"{file}:{n}"
                    rows.append((_text(obj, "prompt", where), _text(obj, "chosen", where), _text(obj, "rejected", where)))
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(file, columns=["prompt", "chosen", "rejected"]).to_pydict()
            for n, (p, c, r) in enumerate(zip(table["prompt"], table["chosen"], table["rejected"], strict=True)):
                where = f"{file} row {n}"
                rows.append((_text({"v": p}, "v", where), _text({"v": c}, "v", where), _text({"v": r}, "v", where)))
    if not rows:
        raise ValueError("data.source: no preference pairs found")
    return rows


def _cache_key(spec: DataSpec, tokenizer_name: str, files: list[Path]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([tokenizer_name, spec.max_seq_len, spec.format]).encode())
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def load_preference_data(
    spec: DataSpec, tokenizer: Tokenizer, tokenizer_name: str, output_dir: str | None
) -> PreferenceData:
    """The preference pairs named by `spec`: synthetic from its seed, or files (cached)."""
    if spec.format == "synthetic":
        pairs = synthetic_pairs(spec.num_samples, spec.max_seq_len, spec.length_mix, spec.seed)
        return tokenise_pairs([(p.prompt, p.chosen, p.rejected) for p in pairs], tokenizer, spec.max_seq_len)
    files = data_files(spec.source, spec.format)
    cache = None
    if output_dir:
        cache = Path(output_dir) / "cache" / f"preference-{_cache_key(spec, tokenizer_name, files)}.pt"
        if cache.exists():
            blob = torch.load(cache, weights_only=True)
            return PreferenceData(blob["prompts"], blob["chosen"], blob["rejected"])
    data = tokenise_pairs(read_rows(files, spec.format), tokenizer, spec.max_seq_len)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save({"prompts": data.prompts, "chosen": data.chosen, "rejected": data.rejected}, tmp)
        os.replace(tmp, cache)  # several ranks may race here; the last complete write wins
    return data
