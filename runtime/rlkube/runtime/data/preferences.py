"""Preference data (prompt, chosen, rejected), tokenised once and cached.

A `PreferenceData` holds, for every pair, three token-id lists. Standard (string) records become
`[bos] + prompt + response + [eos]`; the log-probability of a response counts the response
tokens and the eos. Such samples longer than maxSeqLen are cut from the left of the prompt (the
end of the prompt matters most to the response); a response that alone does not fit is cut from
its right, keeping one prompt token. Conversational records are rendered by chat.py, score the
assistant turns only, and are never cut: one that does not fit is malformed (records.py says
what happens to those).

Files are JSONL, Parquet or a save_to_disk directory (sources.py); a directory of JSONL or
Parquet means all its *.jsonl / *.parquet files, sorted by name. Tokenised data is cached under
`<outputDir>/cache/` keyed by the files' names, sizes and mtimes, the tokenizer, maxSeqLen and
the field mapping, so a restarted pod does not tokenise again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.chat import render_chat
from rlkube.runtime.data.records import (
    InvalidRecord,
    InvalidRecords,
    PreferenceRecord,
    each_valid,
    parse_preference,
)
from rlkube.runtime.data.sources import RawRecord, data_files, read_records
from rlkube.runtime.data.synthetic import synthetic_pairs
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.infra.log import log

__all__ = ["PreferenceData", "data_files", "fit_to_length", "load_preference_data", "tokenise_pairs"]

SPECIALS = 2  # bos + eos
_CACHE_VERSION = 2  # bump when what is cached changes shape


@dataclass
class PreferenceData:
    """Tokenised preference pairs: prompt, chosen and rejected ids per pair.

    With `specials` (standard data, and conversations in the byte tokenizer's plain chat format)
    a sequence is `[bos] + prompt + response + [eos]`; without (a chat template that writes its
    own special tokens) it is `prompt + response` as rendered. A response mask, when present,
    says which response tokens are scored (the assistant's); without one all of them are.
    """

    prompts: list[list[int]]
    chosen: list[list[int]]
    rejected: list[list[int]]
    chosen_mask: list[list[int]] | None = None
    rejected_mask: list[list[int]] | None = None
    specials: bool = True
    skipped: int = 0  # malformed records left out (data.skipInvalid), for the trainer to report

    def __len__(self) -> int:
        return len(self.prompts)

    def seq_lengths(self, i: int) -> tuple[int, int]:
        """Full lengths of the chosen and rejected sequences of pair i (specials included)."""
        p = len(self.prompts[i]) + (SPECIALS if self.specials else 0)
        return p + len(self.chosen[i]), p + len(self.rejected[i])

    def response_mask(self, i: int, rejected: bool) -> list[int]:
        """1 per scored response token of pair i (the eos, when wrapped, is always scored)."""
        masks = self.rejected_mask if rejected else self.chosen_mask
        response = self.rejected[i] if rejected else self.chosen[i]
        mask = list(masks[i]) if masks is not None else [1] * len(response)
        return mask + [1] if self.specials else mask

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


def _tokenise_chat(rec: PreferenceRecord, tokenizer: Tokenizer, max_seq_len: int, specials: int):
    chosen = render_chat(tokenizer, rec.prompt, rec.chosen)  # type: ignore[arg-type]
    rejected = render_chat(tokenizer, rec.prompt, rec.rejected)  # type: ignore[arg-type]
    for name, r in (("chosen", chosen), ("rejected", rejected)):
        n = len(r.prompt) + len(r.completion) + specials
        if n > max_seq_len:
            raise InvalidRecord(
                rec.where,
                f"is {n} tokens with its prompt, longer than data.maxSeqLen={max_seq_len} "
                "(conversations are not truncated: a cut assistant turn would lose its end of turn)",
                name,
            )
    if chosen.prompt != rejected.prompt:
        raise InvalidRecord(rec.where, "renders differently before chosen and rejected", "prompt")
    return chosen, rejected


def tokenise_records(
    raws: Iterable[RawRecord], spec: DataSpec, tokenizer: Tokenizer, invalid: InvalidRecords
) -> PreferenceData:
    """Parse, check and tokenise preference records; malformed ones go to `invalid`."""
    shape: dict = {}

    def build(raw: RawRecord):
        rec = parse_preference(raw, spec.fields, shape)
        if rec.conversational:
            specials = 0 if tokenizer.chat_renders_specials else SPECIALS
            return rec, _tokenise_chat(rec, tokenizer, spec.max_seq_len, specials)
        return rec, None

    built = list(each_valid(raws, invalid, build))
    invalid.finish("preference pairs")
    if not shape.get("conversational"):
        data = tokenise_pairs([(r.prompt, r.chosen, r.rejected) for r, _ in built], tokenizer, spec.max_seq_len)
        data.skipped = invalid.skipped
        return data
    pairs = [chat for _, chat in built]
    return PreferenceData(
        prompts=[c.prompt for c, _ in pairs],
        chosen=[c.completion for c, _ in pairs],
        rejected=[r.completion for _, r in pairs],
        chosen_mask=[c.mask for c, _ in pairs],
        rejected_mask=[r.mask for _, r in pairs],
        specials=not tokenizer.chat_renders_specials,
        skipped=invalid.skipped,
    )


def read_preferences(spec: DataSpec, tokenizer: Tokenizer) -> PreferenceData:
    """The preference records of spec's files, tokenised (no cache)."""
    columns = [spec.fields.column("chosen"), spec.fields.column("rejected")]
    raws = read_records(data_files(spec.source, spec.format), spec.format, columns, [spec.fields.column("prompt")])
    return tokenise_records(raws, spec, tokenizer, InvalidRecords(spec.skip_invalid))

def _cache_key(spec: DataSpec, tokenizer_name: str, fingerprint: str, files: list[Path]) -> str:
    h = hashlib.sha256()
    read = spec.model_dump(include={"format", "max_seq_len", "fields", "skip_invalid"}, mode="json")
    h.update(json.dumps([_CACHE_VERSION, tokenizer_name, fingerprint, read], sort_keys=True).encode())
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
    cache: Path | None = None
    if output_dir:
        key = _cache_key(spec, tokenizer_name, tokenizer.fingerprint, files)
        cache = Path(output_dir) / "cache" / f"preference-{key}.pt"
        if cache.exists():
            data = PreferenceData(**torch.load(cache, weights_only=True))
            if data.skipped:
                log.warning("data: %d invalid record(s) were skipped when %s was built", data.skipped, cache)
            return data
    data = read_preferences(spec, tokenizer)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save(dataclasses.asdict(data), tmp)
        os.replace(tmp, cache)  # several ranks may race here; the last complete write wins
    return data
