"""Length-bucketed ordering of samples, for when packing is off.

Padding costs compute in proportion to the spread of lengths inside a micro-batch. Bucketing
sorts samples by length inside windows of `window` global batches of a shuffled order, cuts
the sorted window into global batches and shuffles those batches again, so each step holds
samples of similar length while the order over an epoch stays random (the "megabatch" trick).
Pure: a function of the lengths, the batch size and a seeded generator.
"""

from __future__ import annotations

import random


def bucketed_batches(
    order: list[int], lengths: list[int], global_batch: int, rng: random.Random, window: int = 64
) -> list[list[int]]:
    """Global batches (lists of sample indices) from `order`, grouped by length."""
    span = global_batch * window
    batches: list[list[int]] = []
    for start in range(0, len(order) - global_batch + 1, span):
        chunk = sorted(order[start : start + span], key=lambda i: (lengths[i], i))
        full = len(chunk) // global_batch * global_batch
        batches.extend(chunk[s : s + global_batch] for s in range(0, full, global_batch))
    rng.shuffle(batches)
    return batches


def padded_cost(lengths: list[int]) -> int:
    """Tokens a padded micro-batch of these sequence lengths computes (rows x longest)."""
    return len(lengths) * max(lengths) if lengths else 0


def padding_fraction(groups: list[list[int]]) -> float:
    """Share of computed tokens that are padding, over micro-batches of sequence lengths."""
    computed = sum(padded_cost(g) for g in groups)
    real = sum(sum(g) for g in groups)
    return 0.0 if computed == 0 else 1.0 - real / computed
