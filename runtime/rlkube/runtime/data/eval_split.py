"""The evaluation set: read from `data.eval`, or held out from the training data by `data.evalFraction`.

Both give data of the training data's own type (preference pairs, unpaired completions, prompts),
tokenised the same way, so a trainer scores eval samples with the code that scores its training
samples. The held-out samples are a function of (number of samples, fraction, data.seed) alone:
every rank, and a restarted pod, holds out the same ones, and they never reach the step sampler.

`data.eval` names a file or directory in any format `data.source` takes; the format is read from
the path (a save_to_disk directory, *.parquet, *.jsonl) and falls back to `data.format` where the
path does not say (a JSONL file named data.txt, say).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch

from rlkube.runtime.contract.config import DataSpec
from rlkube.runtime.contract.data_size import held_out_count
from rlkube.runtime.infra.errors import DataError
from rlkube.runtime.infra.log import log

T = TypeVar("T")

_SUFFIX_FORMAT = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


def holdout_indices(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(training, held out) sample indices, each sorted: round(n * fraction) samples, at least one,
    held out by a permutation seeded by `seed`; at least one sample is left to train on."""
    if n < 2:
        raise DataError(f"data.evalFraction: the training data has {n} sample(s); holding some out needs >= 2")
    k = held_out_count(n, fraction)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + 7)).tolist()
    return sorted(order[k:]), sorted(order[:k])


def subset(data: T, indices: list[int]) -> T:
    """`data` (a dataclass of per-sample lists: PreferenceData, UnpairedData, PromptData) reduced to
    the samples `indices`, in that order; other fields (flags, counts) are kept as they are."""
    n = len(data)  # type: ignore[arg-type]
    picked = {}
    for f in dataclasses.fields(data):  # type: ignore[arg-type]
        value = getattr(data, f.name)
        if isinstance(value, list) and len(value) == n:
            picked[f.name] = [value[i] for i in indices]
    return dataclasses.replace(data, **picked)  # type: ignore[type-var]


def eval_format(path: str, default: str) -> str:
    """The format of the eval data at `path`, read from the path, else `default`."""
    p = Path(path)
    if p.is_dir():
        if (p / "state.json").exists() or (p / "dataset_dict.json").exists() or any(p.glob("*.arrow")):
            return "arrow"
        for suffix, fmt in _SUFFIX_FORMAT.items():
            if any(p.glob(f"*{suffix}")):
                return fmt
    elif p.suffix in _SUFFIX_FORMAT:
        return _SUFFIX_FORMAT[p.suffix]
    if default == "synthetic":
        raise DataError(
            f"data.eval: cannot tell the format of {path!r} (a .jsonl or .parquet file, a directory of "
            "them, or a save_to_disk directory), and data.format is synthetic"
        )
    return default


def eval_spec(spec: DataSpec) -> DataSpec:
    """The DataSpec that reads `spec.eval` with the training data's fields and limits."""
    assert spec.eval is not None
    if not Path(spec.eval).exists():
        raise DataError(f"data.eval: {spec.eval!r} does not exist")
    return spec.model_copy(update={"source": spec.eval, "format": eval_format(spec.eval, spec.format),
                                   "eval": None, "eval_fraction": None})


def split_eval(spec: DataSpec, data: T, load: Callable[[DataSpec], T]) -> tuple[T, T | None]:
    """(training data, eval data or None) for `spec`: `load(eval_spec)` for data.eval, a held-out
    part of `data` for data.evalFraction, None when neither is set."""
    if spec.eval is not None:
        try:
            held = load(eval_spec(spec))
        except DataError as e:  # the loaders name data.source; the file is data.eval's
            raise DataError(str(e).replace("data.source", "data.eval", 1)) from None
        if not len(held):  # type: ignore[arg-type]
            raise DataError(f"data.eval: {spec.eval!r} holds no samples")
        log.info("eval: %d samples from %s", len(held), spec.eval)  # type: ignore[arg-type]
        return data, held
    if spec.eval_fraction is None:
        return data, None
    train, held = holdout_indices(len(data), spec.eval_fraction, spec.seed)  # type: ignore[arg-type]
    log.info("eval: %d of %d samples held out (data.evalFraction=%s)", len(held), len(data),  # type: ignore[arg-type]
             spec.eval_fraction)
    return subset(data, train), subset(data, held)


def eval_micro_batches(n: int, world_size: int, rank: int, micro: int) -> list[list[int]]:
    """This rank's micro-batches of eval samples 0..n-1: samples dealt round-robin over ranks, cut
    into micro-batches of at most `micro`. Every rank gets the same number of micro-batches (FSDP
    forwards are collectives); a rank with fewer samples gets empty lists, which it runs as a
    weight-0 dummy."""
    mine = list(range(rank, n, world_size))
    count = math.ceil(math.ceil(n / world_size) / micro)
    return [mine[k * micro:(k + 1) * micro] for k in range(count)]
