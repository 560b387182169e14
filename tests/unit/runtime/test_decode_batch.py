"""Continuous-batching decode: refilled rows give the tokens of the plain loop, sampling inside the
step has no host sync and draws from the model's distribution, attention reads length buckets."""

import inspect
import re

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from rlkube.runtime.engine import decode_batch
from rlkube.runtime.engine.decode_batch import DecodeBatch, SlotCache, read_buckets
from rlkube.runtime.engine.generation import Decoder, SamplingParams, sample_tokens
from rlkube.runtime.engine.sampling import sampled_logprobs

torch.set_num_threads(1)
VOCAB, PAD = 64, 0


def sharp_model(model_type="qwen2", attn="sdpa"):
    """A tiny model whose greedy choices are not near-ties (random-init logits are nearly flat)."""
    torch.manual_seed(0)
    config = AutoConfig.for_model(
        model_type, vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False,
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model


def left_padded(prompts):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def mixed_prompts(count, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=g).tolist()
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def eos_with_spread(model, ids, mask, steps):
    """An EOS id that ends completions at a spread of lengths (some early, some never)."""
    free = Decoder(model, static_cache=False).generate(ids, mask, SamplingParams(steps, temperature=0.0))
    best, spread = None, -1
    for token in range(1, VOCAB):
        hits = (free.response_ids == token).int()
        first = torch.where(hits.any(1), hits.argmax(1), steps)
        if first.unique().numel() > spread:
            best, spread = token, first.unique().numel()
    return best


@pytest.mark.parametrize("model_type,attn", [("qwen2", "sdpa"), ("llama", "eager")])
def test_refilled_rows_give_the_plain_loops_greedy_tokens_in_prompt_order(model_type, attn, monkeypatch):
    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)  # compaction of the drain, down to one row
    model = sharp_model(model_type, attn)
    prompts = mixed_prompts(11)
    ids, mask = left_padded(prompts)
    eos = eos_with_spread(model, ids, mask, 40)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    want = Decoder(model, static_cache=False).generate(ids, mask, params)
    lengths = want.response_lengths.tolist()
    assert len(set(lengths)) >= 3 and max(lengths) == 40, lengths  # EOS ends rows at different steps
    for rows, refill in [(None, True), (3, True), (3, False), (1, True), (4, True)]:
        decoder = Decoder(model, batch_rows=rows, refill=refill)
        got = decoder.generate(ids, mask, params)
        width = want.response_ids.shape[1]
        assert got.response_ids.shape[1] == width, (rows, refill)
        assert torch.equal(got.response_ids, want.response_ids), (rows, refill)
        assert torch.equal(got.response_mask, want.response_mask), (rows, refill)
        assert torch.equal(got.prompt_ids, ids)
        if rows is None:
            assert decoder.last_stats["compactions"] >= 1, decoder.last_stats
        if rows == 3:
            waves = decoder.last_stats["prefills"] if not refill else None
            assert refill or waves == 4, decoder.last_stats  # 11 prompts in waves of 3
            assert not refill or decoder.last_stats["prefills"] > 4, decoder.last_stats


def test_refill_takes_fewer_steps_than_waves_when_one_completion_is_long():
    model = sharp_model()
    prompts = mixed_prompts(12, seed=3)
    ids, mask = left_padded(prompts)
    eos = eos_with_spread(model, ids, mask, 48)
    params = SamplingParams(max_new_tokens=48, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    steps = {}
    for refill in (True, False):
        decoder = Decoder(model, batch_rows=4, refill=refill)
        decoder.generate(ids, mask, params)
        steps[refill] = decoder.last_stats["steps"]
    assert steps[True] < steps[False], steps


def test_sampled_refill_is_seeded_and_draws_from_the_models_distribution(monkeypatch):
    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)
    model = sharp_model()  # about 26 tokens above 1% after this prompt at temperature 0.7
    prompt = [5, 9, 3]
    ids, mask = left_padded([prompt] * 1500)
    # EOS = the most likely token: rows end at different steps, so the drain is compacted
    with torch.no_grad():
        eos = int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
    params = SamplingParams(max_new_tokens=20, temperature=0.7, eos_token_id=eos, pad_token_id=PAD)
    decoder = Decoder(model, batch_rows=100)
    a = decoder.generate(ids, mask, params, torch.Generator().manual_seed(1)).response_ids
    b = decoder.generate(ids, mask, params, torch.Generator().manual_seed(1)).response_ids
    c = decoder.generate(ids, mask, params, torch.Generator().manual_seed(2)).response_ids
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert decoder.last_stats["compactions"] >= 1, decoder.last_stats
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1] / 0.7, dim=-1)
        other = torch.softmax(model(input_ids=torch.tensor([[7, 7]])).logits[0, -1] / 0.7, dim=-1)
    seen = torch.bincount(torch.cat([a[:, 0], c[:, 0]]), minlength=VOCAB).float() / 3000
    # total variation: ~0.035 expected from 3,000 draws alone; another prompt's distribution is far
    assert float((seen - probs).abs().sum()) / 2 < 0.06
    assert float((seen - other).abs().sum()) / 2 > 0.2
    # every row got its own draw: 1500 rows of one prompt do not all sample the same token
    assert a[:, 0].unique().numel() > 10


def test_sample_tokens_reads_bf16_logits_and_keeps_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(20000, 4).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    got = torch.bincount(sample_tokens(logits, SamplingParams(1, temperature=1.0), gen), minlength=4) / 20000
    assert got.tolist() == pytest.approx([0.5, 0.3, 0.15, 0.05], abs=0.015)
    hot = torch.bincount(sample_tokens(logits, SamplingParams(1, temperature=0.5), gen), minlength=4) / 20000
    want = torch.softmax(logits[0].float() / 0.5, dim=-1)
    assert hot.tolist() == pytest.approx(want.tolist(), abs=0.015)


def test_the_decode_step_has_no_host_sync():
    """What runs per token (the step and the sampling) must not read device values on the host:
    on CUDA that would stall the queue every token and break the captured graph."""
    sync = re.compile(r"\.item\(|\.tolist\(|\.nonzero\(|\.cpu\(|(?<![\w.])(?:bool|int|float)\((?![\"'])|\.any\(\)|\.all\(\)")
    for fn in (DecodeBatch._step, sample_tokens, sampled_logprobs):
        body = inspect.getsource(fn).split('"""')[-1]
        assert not sync.search(body), (fn.__name__, sync.search(body))


def test_attention_reads_only_the_live_bucket(monkeypatch):
    assert read_buckets(128, 256, 384) == [192, 256, 320, 384]
    assert read_buckets(8, 3, 64) == [64]
    model = sharp_model()
    ids, mask = left_padded(mixed_prompts(3))
    reads = []
    real = SlotCache.update

    def spy(self, k, v, layer_idx, *args, **kwargs):
        out = real(self, k, v, layer_idx, *args, **kwargs)
        if self.prefill_rows is None and layer_idx == 0:
            reads.append(out[0].shape[2])
        return out

    monkeypatch.setattr(SlotCache, "update", spy)
    params = SamplingParams(max_new_tokens=200, temperature=0.0, pad_token_id=PAD)
    decoder = Decoder(model)
    out = decoder.generate(ids, mask, params)
    assert out.response_ids.shape[1] == 200
    batch = decoder._batch
    assert batch.buckets == [64, 128, 192, 256] and batch.length == 256
    assert sorted(set(reads)) == [64, 128, 192, 256]  # decode reads only (prefills are not recorded)
    # each read covers the slots written so far: prompt (8) + tokens fed
    for step, read_len in enumerate(reads):
        assert read_len >= 8 + step + 1, (step, read_len)
    # one bucket (the ablation): every step reads the whole cache, same tokens
    reads.clear()
    decoder.length_buckets = 1
    assert torch.equal(decoder.generate(ids, mask, params).response_ids, out.response_ids)
    assert set(reads) == {256}


def test_eos_is_checked_every_few_steps(monkeypatch):
    model = sharp_model()
    ids, mask = left_padded(mixed_prompts(4))
    reads = []
    real = torch.Tensor.tolist

    def spy(t):
        if t.dtype == torch.bool:
            reads.append(1)
        return real(t)

    monkeypatch.setattr(torch.Tensor, "tolist", spy)
    decoder = Decoder(model)
    decoder.generate(ids, mask, SamplingParams(max_new_tokens=40, temperature=0.0, pad_token_id=PAD))
    assert decoder.last_stats["steps"] == 40
    assert len(reads) == 40 // decode_batch.EOS_CHECK_EVERY


def test_a_buckets_graph_is_captured_at_its_third_step_and_an_unreached_bucket_never(monkeypatch):
    """Lazy capture (the module docstring): the first CAPTURE_AFTER steps at a read length run
    eagerly, the next one captures and every later one replays; a bucket no step reaches is never
    captured, and the tokens are those of the eager loop. The CUDA parts (stream, recording) are
    stood in for on the CPU: a 'graph' here replays the eager step it was captured for."""
    monkeypatch.setattr(decode_batch, "COMPACT_MIN_ROWS", 1)
    model = sharp_model()
    ids, mask = left_padded(mixed_prompts(5, seed=4))
    eos = eos_with_spread(model, ids, mask, 100)
    params = SamplingParams(max_new_tokens=100, temperature=0.0, eos_token_id=eos, pad_token_id=PAD)
    want = Decoder(model, static_cache=False).generate(ids, mask, params)
    events = []  # (batch rows, "eager" | "capture" | "replay", read length), in order

    class Replay:
        def __init__(self, batch, read_len):
            self.batch, self.read_len = batch, read_len

        def replay(self):
            events.append((self.batch.rows, "replay", self.read_len))
            self.batch._step(self.read_len)

    def on_own_stream(self, work):
        events.append((self.rows, "eager", self.cache.read_len))  # read_len of the step before; fixed below
        work()
        events[-1] = (self.rows, "eager", self.cache.read_len)

    def capture(self, read_len):
        events.append((self.rows, "capture", read_len))
        self.graphs[read_len] = Replay(self, read_len)
        return self.graphs[read_len]

    real_init = DecodeBatch.__init__

    def init(self, decoder, rows, prompt_len, params, graphs):
        real_init(self, decoder, rows, prompt_len, params, graphs=False)
        self.use_graphs = True  # what graphs=True sets, without its CUDA stream

    monkeypatch.setattr(DecodeBatch, "__init__", init)
    monkeypatch.setattr(DecodeBatch, "_on_own_stream", on_own_stream)
    monkeypatch.setattr(DecodeBatch, "_capture", capture)
    decoder = Decoder(model, static_cache=True, cuda_graphs=False, batch_rows=5)
    got = decoder.generate(ids, mask, params)
    assert torch.equal(got.response_ids, want.response_ids)
    assert torch.equal(got.response_mask, want.response_mask)
    batches = {rows for rows, _, _ in events}
    assert len(batches) >= 2, events  # the drain was compacted into a smaller batch
    reached = {}
    for rows, kind, read_len in events:
        reached.setdefault((rows, read_len), []).append(kind)
    for key, kinds in reached.items():
        eager = decode_batch.CAPTURE_AFTER
        assert kinds[:eager] == ["eager"] * min(eager, len(kinds)), (key, kinds)
        if len(kinds) > eager:  # the third step captured, then replayed; every later step replayed
            assert kinds[eager:eager + 1] == ["capture"] and set(kinds[eager + 1:]) == {"replay"}, (key, kinds)
    full, small = max(batches), min(batches)
    assert decoder._batch.buckets == [64, 128]  # 100 new tokens after 8 prompt columns
    # The 5-row batch is compacted (one long completion left) before any row reads past 64 slots:
    # its 128-slot graph, which capturing every bucket up front made, is never captured.
    assert (full, 64) in reached and (full, 128) not in reached, sorted(reached)
    assert reached[(small, 128)][decode_batch.CAPTURE_AFTER] == "capture"


def test_the_slot_cache_writes_each_rows_slot_in_place_and_refuses_layers_of_another_shape():
    cache = SlotCache(layers=2, rows=3, length=16, device=torch.device("cpu"))
    cache.prefill_rows = torch.arange(3)
    for layer in range(2):
        cache.update(torch.ones(3, 2, 4, 8) * (layer + 1), torch.ones(3, 2, 4, 8), layer)
    cache.prefill_rows = None
    keys = cache.keys
    cache.write_slot.copy_(torch.tensor([4, 7, 5]))
    cache.read_mask = torch.zeros(3, 1, 1, 8, dtype=torch.bool)
    k, v = cache.update(torch.full((3, 2, 1, 8), 9.0), torch.full((3, 2, 1, 8), 9.0), 1)
    assert cache.keys is keys and k.shape == (3, 2, 8, 8) and k.data_ptr() == keys[1].data_ptr()
    assert [int(i) for i in (k[:, 0, :, 0] == 9).nonzero()[:, 1]] == [4, 7, 5]  # each row at its own slot
    assert bool((keys[0, :, :, :4] == 1).all()) and not bool((keys[0] == 9).any())  # layer 0 untouched
    # the compiled layers' write: the same as an operator
    torch.ops.rlkube.write_kv_slots(cache.keys, cache.values, 0, cache.write_slot, torch.full((3, 2, 1, 8), 5.0),
                                    torch.full((3, 2, 1, 8), 5.0))
    assert [int(i) for i in (keys[0, :, 0, :, 0] == 5).nonzero()[:, 1]] == [4, 7, 5]
    # a layer of another shape (per-layer key/value heads) is refused by name, not written wrong
    other = SlotCache(layers=2, rows=3, length=16, device=torch.device("cpu"))
    other.prefill_rows = torch.arange(3)
    other.update(torch.ones(3, 2, 4, 8), torch.ones(3, 2, 4, 8), 0)
    with pytest.raises(ValueError, match="decoder layer 1 has 4 key/value heads"):
        other.update(torch.ones(3, 4, 4, 8), torch.ones(3, 4, 4, 8), 1)
