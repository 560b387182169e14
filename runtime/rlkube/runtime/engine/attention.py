"""Which attention a Hugging Face model runs, and running it under another name for a stretch of code.

transformers looks a layer's attention function up by `config._attn_implementation` on every
forward, and builds the model's masks by the same name. Two of our passes want something else
than the stock function for that stretch, and get it by registering a function under a name of
their own and pointing the config at it until they return (`swapped`):

- decoding (generation.py): grouped-query attention that reads each cached key once;
- the RL forwards over rows moved flush left (policy.py, `causal_attention`): plain causal sdpa,
  with no mask built. Under a name transformers has no mask function for, the model skips mask
  building altogether; under "sdpa" with no mask, transformers would first check on the host
  whether the position ids hold packed sequences, a wait for the device on every forward
  (Llama and Mistral bodies did; Qwen2 took a per-layer-type "no mask" instead).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

# The causal-only sdpa of the flush-left RL forwards (its function is transformers' own sdpa).
CAUSAL_SDPA = "rlkube_causal_sdpa"


def attention_mode(model) -> str:
    """How `model` takes a prebuilt mask: 'sdpa' (bool 4-D), 'eager' (float 4-D) or '2d'."""
    impl = getattr(model.config, "_attn_implementation", None) or "sdpa"
    if impl not in ("sdpa", "eager"):
        # flash-attention takes 2-D padding masks only; it still works here, just without the
        # prebuilt 4-D mask (and so without CUDA graphs).
        return "2d"
    return impl


def _register(name: str, function: Callable) -> None:
    from transformers import AttentionInterface

    if AttentionInterface._global_mapping.get(name) is not function:
        AttentionInterface.register(name, function)


@contextmanager
def swapped(model, name: str, function: Callable, enabled: bool = True):
    """Within: `model`'s layers run `function` as their attention (registered as `name`); the
    model's own attention is back on exit. A no-op when not `enabled`."""
    config = model.config
    before = getattr(config, "_attn_implementation", None)
    if not enabled:
        yield
        return
    _register(name, function)
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def causal_attention(body, length: int):
    """The context for a forward of `body` over rows of `length` tokens that need causal attention
    alone (no padding inside a row's real tokens): sdpa's causal kernel without a mask and without
    the host check (module docstring). Where causal alone would be wrong or is not sdpa's to give
    (eager or flash attention, sliding-window layers the rows are longer than, chunked layers),
    the model builds its masks as usual."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    config = getattr(body, "config", None)
    return swapped(body, CAUSAL_SDPA, sdpa_attention_forward,
                   enabled=config is not None and attention_mode(body) == "sdpa" and _causal_suffices(config, length))


def _causal_suffices(config, length: int) -> bool:
    """Whether every layer of a model with `config` attends to every earlier token of a row of
    `length` tokens (a sliding window at least that long changes nothing)."""
    window = getattr(config, "sliding_window", None)
    within_window = isinstance(window, int) and length <= window
    types = getattr(config, "layer_types", None)
    if types:
        return all(t == "full_attention" or (t == "sliding_attention" and within_window) for t in types)
    return window is None or within_window

