"""Unpaired preference data (KTO's shape): a prompt, one completion, and whether it is desirable.

No trainer consumes it yet; it is read, checked and tokenised here so that files in this shape
fail (or are skipped) with the same record errors as the others, before a KTO trainer exists.
Sequences follow preferences.py: standard records are `[bos] + prompt + completion + [eos]`,
with the prompt cut from the left (then the completion from the right) to fit; conversations are
rendered by the chat template, score the assistant turns only, and are never cut.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.data.chat import render_chat
from rlkube.runtime.data.preferences import SPECIALS, fit_to_length
from rlkube.runtime.data.records import (
    InvalidRecord,
    InvalidRecords,
    UnpairedRecord,
    each_valid,
    parse_unpaired,
)
from rlkube.runtime.data.sources import data_files, read_records
from rlkube.runtime.data.tokenizer import Tokenizer


@dataclass
class UnpairedData:
    prompts: list[list[int]]
    completions: list[list[int]]
    masks: list[list[int]]  # one per completion token: 1 = scored
    labels: list[bool]  # True: desirable
    specials: bool = True  # sequences are [bos] + prompt + completion + [eos]
    skipped: int = 0

    def __len__(self) -> int:
        return len(self.prompts)


def _tokenise(rec: UnpairedRecord, tokenizer: Tokenizer, max_seq_len: int) -> tuple[list[int], list[int], list[int]]:
    if isinstance(rec.prompt, str):
        p, c = fit_to_length(tokenizer.encode(rec.prompt), tokenizer.encode(rec.completion), max_seq_len)  # type: ignore[arg-type]
        return p, c, [1] * len(c)
    chat = render_chat(tokenizer, rec.prompt, rec.completion)  # type: ignore[arg-type]
    n = len(chat.prompt) + len(chat.completion) + (0 if tokenizer.chat_renders_specials else SPECIALS)
    if n > max_seq_len:
        raise InvalidRecord(
            rec.where, f"is {n} tokens with its prompt, longer than data.maxSeqLen={max_seq_len} "
            "(conversations are not truncated)", "completion",
        )
    return chat.prompt, chat.completion, chat.mask


def load_unpaired_data(spec: DataSpec, tokenizer: Tokenizer) -> UnpairedData:
    """Records of spec's files in the unpaired shape, checked and tokenised."""
    fields = spec.fields
    columns = [fields.column(n) for n in ("prompt", "completion", "label")]
    raws = read_records(data_files(spec.source, spec.format), spec.format, columns, [])
    invalid = InvalidRecords(spec.skip_invalid)
    shape: dict = {}

    def build(raw):
        rec = parse_unpaired(raw, fields, shape)
        return (*_tokenise(rec, tokenizer, spec.max_seq_len), rec.label)

    rows = list(each_valid(raws, invalid, build))
    invalid.finish("unpaired records")
    conversational = bool(shape.get("conversational"))
    return UnpairedData(
        prompts=[r[0] for r in rows], completions=[r[1] for r in rows], masks=[r[2] for r in rows],
        labels=[r[3] for r in rows], specials=not (conversational and tokenizer.chat_renders_specials),
        skipped=invalid.skipped,
    )
