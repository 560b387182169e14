"""How preference pairs become model inputs: packed rows, or padded rows as the alternative.

Packed: all sequences of a micro-batch are laid end to end in one row (batch size 1) with no
padding. Position ids restart at 0 for every sequence, and no token may attend across a
sequence boundary. How that boundary is enforced depends on the attention kernel, and is the
reason this module exists as its own concept:

- transformers >= 4.53.1 (masking_utils) recognises a packed row from position ids that restart, when
  the batch has one row and no attention mask is passed: for sdpa/eager it builds a
  block-diagonal causal 4-D mask, for flex_attention a sparse BlockMask, and flash_attention_2
  turns the position ids into cu_seqlens for the varlen kernel (no mask at all).
- When `explicit_mask=True` we build the block-diagonal causal mask ourselves ([1, 1, T, T],
  bool, True = may attend) and pass it; this is the path of record for eager/sdpa and the one
  the tests compare against, so the runtime does not depend on the auto-detection alone.
- flex_attention: engine/logprobs.py builds a sparse BlockMask (same document, causal) from the
  position ids on the device, once per micro-batch, and the policy and the reference forward
  share it (`TokenBatch.flex_mask`). Whole blocks of other documents are skipped, so one row of
  the whole micro-batch costs attention only inside each sequence.

Padded: sequences of similar length (see bucketing.py) are right-padded to the longest one in
the micro-batch with a 2-D padding mask; pad tokens are counted as compute but not as tokens.

Either way the batch says, for every token whose next token is a response token, where its
hidden state sits (`target_index` into the flattened [rows * T] hidden states), which token it
must predict, and which sequence it belongs to, so log-probs are computed for those positions
only (see logprobs.py); a conversation's response scores its assistant turns only (the data's
response mask). Sequence 2k is pair k's chosen, 2k+1 its rejected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkube.runtime.data.preferences import PreferenceData


@dataclass
class TokenBatch:
    """One micro-batch of pairs, ready for the model."""

    input_ids: torch.Tensor  # [rows, T] long
    position_ids: torch.Tensor  # [rows, T] long
    attention_mask: torch.Tensor | None  # None, [rows, T] padding mask, or [1, 1, T, T] block mask
    target_index: torch.Tensor  # [N] long, into the flattened [rows * T] positions
    target_ids: torch.Tensor  # [N] long, the token each target position predicts
    target_seq: torch.Tensor  # [N] long, sequence index (2 * pair + {0 chosen, 1 rejected})
    response_tokens: torch.Tensor  # [2 * pairs] float, tokens scored per sequence
    pairs: int
    real_tokens: int  # non-pad tokens in the batch
    seq_lens: list[int]  # full length of every sequence, in order
    packed: bool
    flex_mask: object = None  # flex_attention's BlockMask, built on the device on first use

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TokenBatch:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return TokenBatch(
            input_ids=move(self.input_ids),
            position_ids=move(self.position_ids),
            attention_mask=move(self.attention_mask),
            target_index=move(self.target_index),
            target_ids=move(self.target_ids),
            target_seq=move(self.target_seq),
            response_tokens=move(self.response_tokens),
            pairs=self.pairs,
            real_tokens=self.real_tokens,
            seq_lens=self.seq_lens,
            packed=self.packed,
        )

    def pin_memory(self) -> TokenBatch:
        def pin(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.pin_memory()

        return TokenBatch(
            pin(self.input_ids), pin(self.position_ids), pin(self.attention_mask), pin(self.target_index),
            pin(self.target_ids), pin(self.target_seq), pin(self.response_tokens), self.pairs,
            self.real_tokens, self.seq_lens, self.packed,
        )


Sequence = tuple[list[int], int, list[int]]  # token ids, prompt length, response loss mask


def sequences(data: PreferenceData, pair_ids: list[int], bos: int, eos: int) -> list[Sequence]:
    """(token ids, prompt length incl. bos, mask of scored response tokens) of every sequence,
    chosen then rejected per pair. Data rendered by a chat template carries its own specials."""
    out = []
    for i in pair_ids:
        prompt = [bos, *data.prompts[i]] if data.specials else list(data.prompts[i])
        end = [eos] if data.specials else []
        out.append((prompt + data.chosen[i] + end, len(prompt), data.response_mask(i, rejected=False)))
        out.append((prompt + data.rejected[i] + end, len(prompt), data.response_mask(i, rejected=True)))
    return out


def block_causal_mask(seq_lens: list[int]) -> torch.Tensor:
    """[1, 1, T, T] bool: position q may attend to k iff same sequence and k <= q."""
    doc = torch.repeat_interleave(torch.arange(len(seq_lens)), torch.tensor(seq_lens))
    same = doc[:, None] == doc[None, :]
    causal = torch.ones(len(doc), len(doc), dtype=torch.bool).tril()
    return (same & causal)[None, None]


def _targets(starts: list[int], seqs: list[Sequence]):
    index, ids, seq_of = [], [], []
    counts = []
    for s, (start, (tokens, prompt_len, mask)) in enumerate(zip(starts, seqs, strict=True)):
        # the hidden state at position t predicts token t + 1; response tokens are [prompt_len, len),
        # of which the mask keeps the scored ones (assistant turns of a conversation)
        scored = [t for t, keep in zip(range(prompt_len, len(tokens)), mask, strict=True) if keep]
        index.extend(start + t - 1 for t in scored)
        ids.extend(tokens[t] for t in scored)
        seq_of.extend([s] * len(scored))
        counts.append(len(scored))
    return (
        torch.tensor(index, dtype=torch.long),
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(seq_of, dtype=torch.long),
        torch.tensor(counts, dtype=torch.float32),
    )


def pack_pairs(
    data: PreferenceData,
    pair_ids: list[int],
    bos: int,
    eos: int,
    explicit_mask: bool = True,
    row_tokens: int | None = None,
    pad: int = 0,
    multiple_of: int = 1,
    min_width: int = 0,
) -> TokenBatch:
    """The sequences of `pair_ids` packed end to end, position ids restarting per sequence.

    `row_tokens=None`: one row holding everything (what flash-attn's varlen path and flex want),
    right-padded to a multiple of `multiple_of` tokens and to at least `min_width` (fewer distinct
    shapes for compiled kernels, see engine/models.py COMPILED_MIN_TOKENS).
    Otherwise rows of at most `row_tokens` tokens (first-fit decreasing; a sequence longer than
    that gets a row of its own), right-padded to the longest row. Bounded rows matter for sdpa,
    whose masked kernel computes every (query, key) block of a row: a few rows of maxSeqLen cost
    far less attention than one row of the whole micro-batch.
    """
    seqs = sequences(data, pair_ids, bos, eos)
    lens = [len(t) for t, _, _ in seqs]
    rows: list[list[int]] = []  # sequence indices per row
    fill: list[int] = []
    if row_tokens is None:
        rows, fill = [list(range(len(seqs)))], [sum(lens)]
    else:
        for s in sorted(range(len(seqs)), key=lambda k: (-lens[k], k)):
            for r in range(len(rows)):
                if fill[r] + lens[s] <= row_tokens:
                    rows[r].append(s)
                    fill[r] += lens[s]
                    break
            else:
                rows.append([s])
                fill.append(lens[s])
    width = max(-(-max(fill) // multiple_of) * multiple_of, min_width)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    starts = [0] * len(seqs)
    row_lens: list[list[int]] = []
    for r, members in enumerate(rows):
        offset = 0
        for s in members:
            n = lens[s]
            ids[r, offset : offset + n] = torch.tensor(seqs[s][0])
            positions[r, offset : offset + n] = torch.arange(n)
            starts[s] = r * width + offset
            offset += n
        positions[r, offset:] = torch.arange(width - offset)  # padding: a block of its own
        row_lens.append([lens[s] for s in members] + ([width - offset] if offset < width else []))
    index, target_ids, seq_of, counts = _targets(starts, seqs)
    mask = None
    if explicit_mask and any(len(m) > 1 for m in rows):
        # right padding after a single sequence needs no mask (causal already hides it)
        mask = torch.cat([block_causal_mask(rl) for rl in row_lens], dim=0)
    return TokenBatch(
        input_ids=ids,
        position_ids=positions,
        attention_mask=mask,
        target_index=index,
        target_ids=target_ids,
        target_seq=seq_of,
        response_tokens=counts,
        pairs=len(pair_ids),
        real_tokens=sum(lens),
        seq_lens=lens,
        packed=True,
    )


def pad_pairs(
    data: PreferenceData, pair_ids: list[int], bos: int, eos: int, pad: int, padding_mask: bool = True
) -> TokenBatch:
    """One row per sequence, right-padded to the longest, with a 2-D padding mask.

    `padding_mask=False` passes no mask at all: with right padding and causal attention no real
    token can see a pad (pads come after it), so the mask changes nothing for the tokens that
    are scored, and without it sdpa keeps its fast causal (flash) kernel instead of a masked one.
    """
    seqs = sequences(data, pair_ids, bos, eos)
    lens = [len(t) for t, _, _ in seqs]
    width = max(lens)
    rows = [t + [pad] * (width - len(t)) for t, _, _ in seqs]
    mask = [[1] * n + [0] * (width - n) for n in lens]
    index, ids, seq_of, counts = _targets([r * width for r in range(len(seqs))], seqs)
    return TokenBatch(
        input_ids=torch.tensor(rows, dtype=torch.long),
        position_ids=torch.arange(width).repeat(len(seqs), 1),
        attention_mask=torch.tensor(mask, dtype=torch.long) if padding_mask else None,
        target_index=index,
        target_ids=ids,
        target_seq=seq_of,
        response_tokens=counts,
        pairs=len(pair_ids),
        real_tokens=sum(lens),
        seq_lens=lens,
        packed=False,
    )
