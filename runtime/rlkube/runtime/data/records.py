"""The shapes of training records, as TRL names them, parsed and checked before any tokenising.

- standard: `prompt`, `chosen`, `rejected` are strings;
- conversational: they are lists of `{role, content}` messages. Without a `prompt` the prompt is
  implicit: the messages that chosen and rejected share from the start, minus any assistant
  turns at its end (the completion starts with the first assistant turn after the prompt);
- prompt-only (PPO, GRPO): `prompt` (string or messages) and an optional `answer` for rule
  rewards;
- unpaired (KTO): `prompt`, `completion` (both strings or both messages) and a boolean `label`.

Fields are looked up under the column names of `data.fields`. A record that breaks a rule raises
`InvalidRecord`, which names where it was read, the field (and its column, when mapped) and what
is wrong; `InvalidRecords` then either stops the run with it or, with `data.skipInvalid`, logs
it and counts it. A dataset has one shape: a record of another shape than the first is invalid.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from rlkube.runtime.contract.config import DataFields
from rlkube.runtime.data.sources import RawRecord
from rlkube.runtime.infra.errors import DataError
from rlkube.runtime.infra.log import log

Text = str | list[dict]  # a string, or messages [{role, content}]
_LOGGED = 10  # skipped records logged one by one; the rest only counted
T = TypeVar("T")


class InvalidRecord(DataError):
    """A malformed record: where it was read, which field, what is wrong."""

    def __init__(self, where: str, problem: str, field: str | None = None, fields: DataFields | None = None):
        self.where, self.field = where, field
        name = ""
        if field is not None:
            head = field.split("[")[0]  # "chosen[2].content" -> "chosen"
            column = fields.column(head) if fields else head
            name = f"field {field!r} " if column == head else f"field {field!r} (column {column!r}) "
        super().__init__(f"data.source: {where}: {name}{problem}")


class InvalidRecords:
    """What happens to malformed records: raised at once, or logged and counted (skipInvalid)."""

    def __init__(self, skip: bool) -> None:
        self.skip = skip
        self.skipped = 0
        self.seen = 0

    def reject(self, error: InvalidRecord) -> None:
        if not self.skip:
            raise error
        self.skipped += 1
        if self.skipped <= _LOGGED:
            log.warning("skipping invalid record (data.skipInvalid): %s", error)
        elif self.skipped == _LOGGED + 1:
            log.warning("more invalid records skipped; only the count is logged from here on")

    def finish(self, kind: str) -> None:
        """Log the count; fail when nothing valid is left."""
        if self.skipped:
            log.warning("data: skipped %d invalid record(s) of %d (data.skipInvalid)", self.skipped, self.seen)
        if self.seen == self.skipped:
            reason = f" ({self.skipped} invalid, all skipped)" if self.skipped else ""
            raise DataError(f"data.source: no {kind} found{reason}")


def each_valid(raws: Iterable[RawRecord], invalid: InvalidRecords, build: Callable[[RawRecord], T]) -> Iterator[T]:
    """`build(raw)` of every record; the ones it finds malformed go to `invalid`."""
    for raw in raws:
        invalid.seen += 1
        try:
            yield build(raw)
        except InvalidRecord as e:
            invalid.reject(e)


@dataclass(frozen=True)
class PreferenceRecord:
    where: str
    prompt: Text
    chosen: Text
    rejected: Text

    @property
    def conversational(self) -> bool:
        return isinstance(self.chosen, list)


@dataclass(frozen=True)
class PromptRecord:
    where: str
    prompt: Text
    answer: str | None


@dataclass(frozen=True)
class UnpairedRecord:
    where: str
    prompt: Text
    completion: Text
    label: bool


class _Reader:
    """Field access on one raw record, raising InvalidRecord with its place and field."""

    def __init__(self, raw: RawRecord, fields: DataFields) -> None:
        if raw.problem is not None:
            raise InvalidRecord(raw.where, raw.problem)
        self.raw, self.fields = raw, fields

    def error(self, field: str, problem: str) -> InvalidRecord:
        return InvalidRecord(self.raw.where, problem, field, self.fields)

    def has(self, name: str) -> bool:
        return self.raw.values.get(self.fields.column(name)) is not None

    def text(self, name: str, messages_allowed: bool = True) -> Text:
        value = self.raw.values.get(self.fields.column(name))
        if value is None:
            raise self.error(name, "is missing")
        if isinstance(value, str):
            if not value.strip():
                raise self.error(name, "is empty")
            return value
        if isinstance(value, list) and messages_allowed:
            return self.messages(name, value)
        want = "a string or a list of {role, content} messages" if messages_allowed else "a string"
        raise self.error(name, f"must be {want}, got {type(value).__name__}")

    def messages(self, name: str, value: list) -> list[dict]:
        if not value:
            raise self.error(name, "is an empty list of messages")
        out = []
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                raise self.error(f"{name}[{i}]", f"must be a {{role, content}} message, got {type(m).__name__}")
            for key in ("role", "content"):
                v = m.get(key)
                if not isinstance(v, str):
                    raise self.error(f"{name}[{i}].{key}", f"must be a string, got {type(v).__name__}")
                if not v.strip():
                    raise self.error(f"{name}[{i}].{key}", "is empty")
            out.append({"role": m["role"], "content": m["content"]})
        return out


def _same_shape(r: _Reader, shape: dict, first: str, values: dict[str, Text]) -> None:
    """Every text field has the first field's shape (all strings or all messages)."""
    want = isinstance(values[first], list)
    for name, v in values.items():
        if isinstance(v, list) != want:
            kind = "messages" if want else "a string"
            raise r.error(name, f"must be {kind} like {first!r} (standard and conversational fields mixed)")
    seen = shape.setdefault("conversational", want)
    if seen != want:
        kind = "conversational" if seen else "standard"
        raise r.error(first, f"makes this record {'conversational' if want else 'standard'}, but the "
                      f"data's first record is {kind}; one dataset has one shape")


def _needs_assistant(r: _Reader, name: str, messages: list[dict]) -> None:
    if messages[-1]["role"] != "assistant":
        raise r.error(name, "must end with an assistant message (the turn that is scored)")


def implicit_prompt(chosen: list[dict], rejected: list[dict]) -> int:
    """Length of the implicit prompt: the shared opening messages, minus trailing assistant turns."""
    n = 0
    while n < min(len(chosen), len(rejected)) and chosen[n] == rejected[n]:
        n += 1
    while n > 0 and chosen[n - 1]["role"] == "assistant":
        n -= 1
    return n


def parse_preference(raw: RawRecord, fields: DataFields, shape: dict) -> PreferenceRecord:
    """One preference record; `shape` remembers the first record's shape across calls."""
    r = _Reader(raw, fields)
    chosen, rejected = r.text("chosen"), r.text("rejected")
    if isinstance(chosen, list) and not r.has("prompt"):
        _same_shape(r, shape, "chosen", {"chosen": chosen, "rejected": rejected})
        n = implicit_prompt(chosen, rejected)
        if n == 0:
            raise r.error("prompt", "is missing, and chosen and rejected share no opening messages to "
                          "take an implicit prompt from")
        prompt: Text = chosen[:n]
        chosen, rejected = chosen[n:], rejected[n:]
    else:
        prompt = r.text("prompt")
        _same_shape(r, shape, "chosen", {"chosen": chosen, "rejected": rejected, "prompt": prompt})
    if isinstance(chosen, list):
        _needs_assistant(r, "chosen", chosen)
        _needs_assistant(r, "rejected", rejected)
    return PreferenceRecord(raw.where, prompt, chosen, rejected)


def parse_prompt(raw: RawRecord, fields: DataFields, shape: dict) -> PromptRecord:
    r = _Reader(raw, fields)
    prompt = r.text("prompt")
    _same_shape(r, shape, "prompt", {"prompt": prompt})
    answer = raw.values.get(fields.column("answer"))
    if answer is not None and not isinstance(answer, str):
        # numbers are common answers (GSM8K-style); rule rewards compare text
        if isinstance(answer, bool) or not isinstance(answer, int | float):
            raise r.error("answer", f"must be a string or a number, got {type(answer).__name__}")
        answer = str(answer)
    return PromptRecord(raw.where, prompt, answer)


def parse_unpaired(raw: RawRecord, fields: DataFields, shape: dict) -> UnpairedRecord:
    r = _Reader(raw, fields)
    prompt, completion = r.text("prompt"), r.text("completion")
    _same_shape(r, shape, "prompt", {"prompt": prompt, "completion": completion})
    if isinstance(completion, list):
        _needs_assistant(r, "completion", completion)
    label = raw.values.get(fields.column("label"))
    if not isinstance(label, bool):
        got = "nothing" if label is None else type(label).__name__
        raise r.error("label", f"must be true or false, got {got}")
    return UnpairedRecord(raw.where, prompt, completion, label)
