"""Decoding through compiled decoder layers (engine/decode_layers.py) gives the completions of the
uncompiled decoder: greedy tokens equal, with refill (prefills of changing row counts and
decode steps of changing read lengths under one dynamic graph each), and the layers are
uncompiled again afterwards.
The cache write is an operator of its own inside the one graph every layer shares
(decode_batch.write_kv_slots), in place on the decoder's cache. On CPU inductor generates C++ (gcc): a compile of ~10-30 s."""

from __future__ import annotations

import pytest
import torch

from rlkube.runtime.engine.generation import Decoder, SamplingParams
from rlkube.runtime.engine.models import decoder_layers

pytestmark = pytest.mark.slow

PAD = 0
PROMPTS = [[5, 9, 3, 17, 22, 8, 1], [40, 2], [7, 7, 30, 11], [12, 13], [50, 51, 52], [6]]


def tiny_model(hidden: int = 32):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model(
        "qwen2", vocab_size=64, hidden_size=hidden, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def test_compiled_layers_decode_the_same_tokens():
    torch._dynamo.reset()
    model = tiny_model()
    ids, mask = left_padded(PROMPTS)
    # EOS: a token the first completion says early on, so completions end at different lengths
    # and 2 rows for 6 prompts refill.
    free = Decoder(model).generate(ids, mask, SamplingParams(max_new_tokens=20, temperature=0.0, pad_token_id=PAD))
    eos = int(free.response_ids[0, 2])
    params = SamplingParams(max_new_tokens=20, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    eager = Decoder(model, batch_rows=2).generate(ids, mask, params)
    decoder = Decoder(model, batch_rows=2, compile_layers=True)
    counted = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # the process's (earlier tests too)
    compiled = decoder.generate(ids, mask, params)
    # Every layer shares one graph, the cache write inside it (4 while the write broke the graph,
    # 6 while the batch's one-token prefill was compiled too; each is compile time at start-up).
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - counted
    assert graphs == 1, graphs
    assert torch.equal(compiled.response_ids, eager.response_ids)
    assert torch.equal(compiled.response_mask, eager.response_mask)
    assert len(set(eager.response_lengths.tolist())) > 1  # the completions ended at different lengths
    assert all(layer._compiled_call_impl is None for layer in decoder_layers(model))
    # a second call reuses the compiled calls (same objects)
    calls = dict(decoder.compiled_layers.calls)
    assert len(calls) == 2
    again = decoder.generate(ids, mask, params)
    assert torch.equal(again.response_ids, eager.response_ids)
    assert decoder.compiled_layers.calls == calls
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - counted == graphs  # nothing compiled again


def test_a_batch_as_wide_as_a_head_and_a_read_of_the_whole_cache_compile_nothing_more():
    """Two start-up recompiles seen on the GPU (TORCH_LOGS=recompiles, GRPO with 128 rows and
    head_dim 128): dynamo gave the batch and head_dim one symbol, so every smaller batch compiled
    the graphs again, and the last read-length bucket, a read of the whole cache, guarded apart.
    Here 16 rows meet head_dim 16 and completions of up to 120 tokens read the whole cache."""
    torch._dynamo.reset()
    model = tiny_model(hidden=64)
    assert model.config.hidden_size // model.config.num_attention_heads == 16
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 64, (int(torch.randint(3, 9, (1,), generator=g)),), generator=g).tolist()
               for _ in range(16)]
    ids, mask = left_padded(prompts)
    params = SamplingParams(max_new_tokens=120, temperature=1.0, eos_token_id=7, pad_token_id=PAD)
    decoder = Decoder(model, compile_layers=True)
    counted = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    out = decoder.generate(ids, mask, params, generator=torch.Generator().manual_seed(0))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"] - counted
    lengths = out.response_lengths.tolist()
    # the test's premises: rows finished at different times (smaller batches), and some row read
    # past the first bucket into the whole cache (prompt 8 + 120 tokens = 128 slots)
    assert min(lengths) < 40 and max(lengths) + ids.shape[1] > 64, lengths
    assert graphs == 1, graphs  # 9 once: 3 more for the batch's symbol, 2 for the whole-cache read


def test_a_layer_its_trainer_compiled_decodes_through_the_decode_call_and_gets_its_own_back():
    """PPO/GRPO with `model.compile: layers` compile the layers for training (models.compile_layers);
    a training graph would write the KV cache inside the graph, so generation takes the layer over."""
    model = tiny_model()
    layers = decoder_layers(model)
    own = object()
    layers[0]._compiled_call_impl = own
    decoder = Decoder(model, compile_layers=True)
    with decoder.compiled_layers:
        decoding = [layer._compiled_call_impl for layer in layers]
        assert own not in decoding and None not in decoding
        with decoder.compiled_layers.paused():  # a prefill: every layer eager
            assert all(layer._compiled_call_impl is None for layer in layers)
        assert [layer._compiled_call_impl for layer in layers] == decoding
    assert layers[0]._compiled_call_impl is own and layers[1]._compiled_call_impl is None
    # decode compile off (or FSDP-sharded layers): the trainer's graph is not used to decode either
    with Decoder(model, compile_layers=False).compiled_layers:
        assert all(layer._compiled_call_impl is None for layer in layers)
    assert layers[0]._compiled_call_impl is own
