"""Seeded synthetic preference data that a tiny model can learn, in two length regimes.

Every prompt is a short random pattern of letters (period 2..6, from a 16-letter alphabet)
repeated; the chosen response continues the pattern exactly where the prompt stopped, the
rejected response is random letters of the same alphabet. Letter frequencies over the data are
the same for both, so no fixed token bias separates them: the model must look back into the
prompt (are these the prompt's letters, in its order?). A 2-layer model learns that within tens
of steps, which makes preference accuracy a real learning signal for tests. (With rejected
drawn from the pattern's own letters only the order would tell them apart; tiny models on a CPU
budget plateau near 90% on that, so it is not the default.)

Lengths are in characters, which the byte tokenizer maps one-to-one to tokens; with the bos and
eos tokens a sample's full sequence is `length` tokens:
- "fixed": every sequence is exactly maxSeqLen tokens, half prompt, half response.
- "longTailed": total length log-normal with median 300 (sigma 1.0, so about 3% of samples
  exceed 2,000 tokens), clipped to [16, maxSeqLen].
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from rlkube.runtime.infra.errors import DataError

ALPHABET = "abcdefghijklmnop"
LONG_TAIL_MEDIAN = 300
LONG_TAIL_SIGMA = 1.0
MIN_LENGTH = 16
SPECIAL_TOKENS = 2  # bos + eos around prompt + response


@dataclass(frozen=True)
class TextPair:
    prompt: str
    chosen: str
    rejected: str


def sample_lengths(num: int, max_seq_len: int, length_mix: str, seed: int) -> list[int]:
    """Full sequence lengths (tokens, specials included) for `num` samples."""
    if length_mix == "fixed":
        return [max_seq_len] * num
    if length_mix != "longTailed":
        raise DataError(f"data.lengthMix: must be 'fixed' or 'longTailed', got {length_mix!r}")
    rng = random.Random(seed * 1_000_003 + 17)
    low = min(MIN_LENGTH, max_seq_len)
    mu = math.log(LONG_TAIL_MEDIAN)
    return [min(max_seq_len, max(low, round(rng.lognormvariate(mu, LONG_TAIL_SIGMA)))) for _ in range(num)]


def make_pair(rng: random.Random, length: int) -> TextPair:
    """One pair whose chosen and rejected sequences are both `length` tokens long."""
    body = max(2, length - SPECIAL_TOKENS)
    response = max(1, body // 2)
    prompt = body - response
    period = rng.randint(2, 6)
    pattern = [rng.choice(ALPHABET) for _ in range(period)]
    text = "".join(pattern[i % period] for i in range(prompt + response))
    rejected = "".join(rng.choice(ALPHABET) for _ in range(response))
    return TextPair(prompt=text[:prompt], chosen=text[prompt:], rejected=rejected)


def synthetic_pairs(num: int, max_seq_len: int, length_mix: str, seed: int) -> list[TextPair]:
    """`num` pairs, the same for the same arguments on every machine."""
    lengths = sample_lengths(num, max_seq_len, length_mix, seed)
    rng = random.Random(seed)
    return [make_pair(rng, n) for n in lengths]
