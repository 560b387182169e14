"""Sliding-window attention while decoding: which layers slide, by how much, and the masks they take.

Why: the decoders (decode_batch.py, and generation.py's plain loop) hand the model a prebuilt 4-D
mask, so the model builds none of its own, and before this every layer attended to the whole
cache. A model whose layers attend only to the last `sliding_window` tokens (Mistral-style
models with a window set, Qwen2 with `use_sliding_window`, Gemma 2 and 3's sliding layers) then
generated from another model than the one the trainer's forward computes once a row was longer
than the window: Gemma 3's window is 512 or 1,024 tokens.

How: HF's rule is that a query at position q sees keys at positions k > q - window. Within a decode
row, a real token's slot and its position differ by a constant (a row's left padding sits before
its first token, and generated tokens follow the prompt slot by slot), so the same rule holds on
slots. Models that list `layer_types` take a mask per type (a dict: full layers get the full mask,
sliding layers the windowed one); models that slide every layer take the windowed mask alone. A
window at least as long as the cache changes nothing and is ignored, so most runs build no second
mask.
"""

from __future__ import annotations

import torch

FULL, SLIDING = "full_attention", "sliding_attention"


def decode_window(config, length: int) -> int | None:
    """The window of the model's sliding layers, where it is shorter than `length` (the slots a
    decode row holds); None when no layer slides or the window covers every slot."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or window <= 0 or window >= length:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None:
        unknown = sorted(set(types) - {FULL, SLIDING})
        if unknown:
            raise ValueError(f"generation: layer types {unknown} are not decoded here "
                             f"(full_attention and sliding_attention are)")
        return window if SLIDING in types else None
    return window if getattr(config, "use_sliding_window", True) else None


def layer_masks(config, full, sliding):
    """The model's `attention_mask` argument: `full` alone when no layer slides (`sliding` None),
    else the per-type dict of a model that lists `layer_types`, else `sliding` (every layer slides)."""
    if sliding is None:
        return full
    if getattr(config, "layer_types", None) is not None:
        return {FULL: full, SLIDING: sliding}
    return sliding


def within_window(query_slots: torch.Tensor, key_slots: torch.Tensor, window: int) -> torch.Tensor:
    """Which keys a query sees under the window: k > q - window (broadcast)."""
    return key_slots > query_slots - window
