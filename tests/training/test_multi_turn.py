"""Multi-turn rollouts (rollout.maxTurns > 1) on CPU with a tiny random model and the byte tokenizer.

A random model never writes `</tool_call>` on its own, so the tests make it call tools: the
episodes stop on a token the tiny model does say (greedily, or sampled at a low temperature), and
the parser is replaced by one that reads every such turn as a call of the calculator. What is
checked is what the trainer does with the calls: the tool turns' tokens, the masks token by token,
the KV cache kept across turns, a failed call's episode masked out and counted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rlkube.runtime.trainers.rl.multi_turn as multi_turn
from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.tokenizer import ByteTokenizer
from rlkube.runtime.engine.episodes import EpisodeDecoder
from rlkube.runtime.engine.generation import Decoder
from rlkube.runtime.engine.policy import PolicyModel
from rlkube.runtime.engine.sampling import SamplingParams
from rlkube.runtime.infra.distributed import DistContext
from rlkube.runtime.tools import FunctionTools, ToolCall, ToolTurnFormat
from rlkube.runtime.trainers.rl.trainer import RLTrainer

from .rl_common import TINY_MODEL, rl_config

TOOLS = {"function": "rlkube.runtime.tools.calculator:calculator"}
NEW, EPISODE, TURNS = 8, 48, 3
TOOL_TURN = list(b"\ntool: 42\nassistant: ")  # the byte tokenizer's tool turn of the calculator's "42"


def tiny_lm(attention: str = "sdpa") -> torch.nn.Module:
    cfg = AutoConfig.for_model(**{**TINY_MODEL, "max_position_embeddings": 256})
    cfg._attn_implementation = attention
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Six left-padded prompts of mixed lengths."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (6, 9), generator=g)
    mask = torch.ones_like(ids)
    for row, pad in enumerate([0, 3, 1, 5, 0, 2]):
        mask[row, :pad] = 0
    return ids, mask


def frequent_token(lm, ids, mask, params: SamplingParams) -> int:
    out = Decoder(lm, static_cache=False).generate(ids, mask, dataclasses.replace(params, temperature=0.0))
    values, counts = out.response_ids.unique(return_counts=True)
    return int(values[counts.argmax()])


# -- the engine: KV cache kept across turns; one turn is the plain loop ------------------------------

@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("batch_rows", [None, 4])
def test_kv_cache_across_turns_gives_the_log_probs_of_encoding_the_episode_again(attention, batch_rows):
    """(b) The log-probs the episode decoder computed while generating, turn after turn over one
    cache with only the tool tokens prefilled between turns, are those of the whole episode
    encoded again from the start (float32). Greedy, so that the tiny model's turns end at the
    stop token often enough to make several turns."""
    torch.set_num_threads(1)
    lm, (ids, mask) = tiny_lm(attention), prompts()
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0, eos_token_id=258, pad_token_id=256)
    stop = frequent_token(lm, ids, mask, params)
    lengths = iter(range(1, 1000))

    def between(rows, turns):  # tool turns of different lengths, so rows' appended blocks differ
        return [[ord("x")] * (2 + next(lengths) % 5) for _ in rows]

    out = EpisodeDecoder(Decoder(lm, static_cache=False), max_turns=4, max_episode_tokens=EPISODE,
                         stop_ids=[stop]).generate(ids, mask, dataclasses.replace(params, temperature=0.0), between,
                                                   torch.Generator().manual_seed(3), batch_rows=batch_rows)
    assert max(out.turns) > 1 and (out.response_mask - out.policy_mask).sum() > 0  # tools were called
    policy = PolicyModel(lm, temperature=0.0)  # greedy: the log-probs of the model's own distribution
    seq, att = torch.cat([ids, out.response_ids], 1), torch.cat([mask, out.response_mask], 1)
    again, _ = policy(seq, att, ids.shape[1], out.response_mask)
    where = out.policy_mask.bool()
    assert torch.allclose(out.logprobs[where], again[where], atol=1e-5, rtol=0)
    assert out.logprobs[~where].abs().sum() == 0


def test_one_turn_is_the_plain_loop():
    """(c) With one turn and no stop sequence the episode decoder draws the plain loop's tokens
    (sampled, same generator), and greedy ones are the default decoder's too."""
    torch.set_num_threads(1)
    lm, (ids, mask) = tiny_lm(), prompts()
    params = SamplingParams(max_new_tokens=NEW, temperature=1.0, eos_token_id=258, pad_token_id=256)
    one = EpisodeDecoder(Decoder(lm, static_cache=False), max_turns=1, max_episode_tokens=NEW)
    never = lambda rows, turns: pytest.fail("one turn asks for no tool")  # noqa: E731
    sampled = one.generate(ids, mask, params, never, torch.Generator().manual_seed(5))
    plain = Decoder(lm, static_cache=False).generate(ids, mask, params, torch.Generator().manual_seed(5))
    assert torch.equal(sampled.response_ids, plain.response_ids)
    assert torch.equal(sampled.response_mask, plain.response_mask)
    assert torch.equal(sampled.policy_mask, plain.response_mask)
    greedy = dataclasses.replace(params, temperature=0.0)
    assert torch.equal(one.generate(ids, mask, greedy, never).response_ids,
                       Decoder(lm).generate(ids, mask, greedy).response_ids)


# -- the trainer ----------------------------------------------------------------------------------

def trainer_for(tmp: Path, monkeypatch, temperature: float = 0.0, roles: dict | None = None,
                **rollout) -> RLTrainer:
    """A GRPO trainer of 4 prompts x 4 whose episodes call the calculator at a token the model says
    (`roles`: roles to add, such as an environment)."""
    torch.set_num_threads(1)
    cfg = rl_config(tmp, "grpo", batching={"globalBatch": 4, "maxMicroBatch": 16, "mode": "fixed"},
                    training={"steps": 1, "lr": 3e-3, "groupSize": 4, "seed": 0},
                    rollout={"maxNewTokens": NEW, "temperature": 1.0, **rollout}, **({"roles": roles} if roles else {}))
    trainer = RLTrainer(RuntimeConfig.model_validate(cfg), DistContext())
    if trainer.episodes is not None:
        monkeypatch.setattr(multi_turn, "parse_tool_call", lambda text: ToolCall("calculator", {"expression": "6*7"}))
        batch = trainer.rollout.prompts(0)
        trainer.rollout.sampling = dataclasses.replace(trainer.rollout.sampling, temperature=temperature)
        trainer.episodes.decoder.stop_ids = [frequent_token(trainer.actor.model.lm, batch.ids, batch.mask,
                                                            trainer.rollout.sampling)]
    return trainer


def runs(row: torch.Tensor) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values of a 1-D tensor."""
    out, start = [], 0
    values = row.tolist()
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            out.append((values[start], start, i))
            start = i
    return out


def test_tool_tokens_are_attended_to_and_never_trained_on(tmp_path, monkeypatch):
    """(a) Each row's response is its turns and, between them, exactly the tool turn's tokens; the
    mask the losses read is 1 on the policy's tokens and 0 on every tool token, token by token; the
    step trains on the policy's tokens only and reports the turns and tool tokens."""
    trainer = trainer_for(tmp_path, monkeypatch, maxTurns=TURNS, maxEpisodeTokens=EPISODE, tools=TOOLS)
    assert ToolTurnFormat.of(ByteTokenizer()).tokens(ByteTokenizer(), "42") == TOOL_TURN
    stop = trainer.episodes.decoder.stop_ids
    rollout, stats = trainer.rollout.generate(0)
    p = rollout.prompt_len
    attention, trained = rollout.attention_mask[:, p:], rollout.response_mask
    assert rollout.policy_mask is not None and int(stats["tools"].tool_calls) > 0
    for r in range(rollout.rows):
        real = int(attention[r].sum())
        assert attention[r, :real].all() and not attention[r, real:].any()  # one run of real tokens
        tokens = rollout.sequences[r, p:p + real]
        parts = runs(trained[r, :real])
        assert parts[0][0] == 1 and parts[-1][0] == 1  # an episode starts and ends with the policy's turn
        for value, start, end in parts:
            if value == 0:  # a tool turn: exactly the calculator's, after a turn that stopped at the call
                assert tokens[start:end].tolist() == TOOL_TURN
                assert tokens[start - len(stop):start].tolist() == stop
        turns = sum(1 for value, _, _ in parts if value == 1)
        assert 1 <= turns <= TURNS and real <= EPISODE
    assert trained.sum() < attention.sum()
    # the reward reads the whole episode, tool turns included
    prompts_text, completions = trainer.scorer._completion_texts(rollout, slice(0, rollout.rows), trainer.data)
    assert any("\ntool: 42\nassistant: " in text for text in completions)

    # old and reference log-probs are taken at the policy's tokens only (0 at tool tokens, as the
    # actor's own are there), so no ratio or KL of a tool token is formed
    from rlkube.runtime.trainers.rl.scoring import response_logprobs

    logps = response_logprobs(trainer.actor.model, rollout, [torch.arange(rollout.rows)], 0, torch.device("cpu"))
    assert (logps[trained.bool()] < 0).all() and logps[~trained.bool()].abs().sum() == 0

    rec = trainer.train_step(0, 3e-3)
    policy_tokens = int(trained.sum())
    assert rec["toolTokens"] == int(attention.sum()) - policy_tokens
    assert rec["toolCalls"] == rec["toolTokens"] // len(TOOL_TURN) and rec["toolCallFailures"] == 0
    assert rec["turnsPerEpisode"] == pytest.approx(1 + rec["toolCalls"] / rollout.rows)
    assert rec["responseLengthMean"] == pytest.approx(policy_tokens / rollout.rows)
    trained_on = trainer.train_on(rollout, trainer._score(rollout),
                                  trainer.estimate(trainer._score(rollout), rollout.response_mask.float(),
                                                   trainer.config.training), 1)
    assert trained_on["actor"].tokens == policy_tokens  # the loss's tokens: the policy's, no tool token


def test_the_generation_mismatch_compares_the_policys_tokens_only(tmp_path, monkeypatch):
    """(d) The episodes record the log-prob of each token the policy sampled and 0 at the tool
    tokens (never sampled); the step record's mismatch is over the policy's tokens only: a log-prob
    put at every tool token would dominate it if the comparison read them."""
    trainer = trainer_for(tmp_path, monkeypatch, maxTurns=TURNS, maxEpisodeTokens=EPISODE, tools=TOOLS)
    real, seen = trainer.rollout.generate, []

    def with_tool_logprobs(step, prompts=None):
        rollout, stats = real(step, prompts)
        tool = rollout.episode_mask.bool() & ~rollout.response_mask.bool()
        seen.append((rollout.generation_logprobs.clone(), rollout.response_mask.bool(), tool))
        rollout.generation_logprobs = torch.where(tool, -5.0, rollout.generation_logprobs)
        return rollout, stats

    monkeypatch.setattr(trainer.rollout, "generate", with_tool_logprobs)
    rec = trainer.train_step(0, 3e-3)
    recorded, policy, tool = seen[0]
    assert tool.any() and (recorded[policy] < 0).all() and recorded[~policy].abs().sum() == 0
    assert 0 <= rec["rolloutLogprobAbsDiff"] < 1e-4 and rec["rolloutLogprobMaxDiff"] < 1e-3, rec


def test_max_turns_one_is_todays_rollout(tmp_path, monkeypatch):
    """(c) maxTurns 1 (the default) takes the single-turn path: no policy mask, the decoder's own
    tokens for the step's seed, no multi-turn fields in the record."""
    trainer = trainer_for(tmp_path, monkeypatch)
    assert trainer.episodes is None
    rollout, _ = trainer.rollout.generate(0)
    assert rollout.policy_mask is None and torch.equal(rollout.response_mask, rollout.attention_mask[:, rollout.prompt_len:])
    batch = trainer.rollout.prompts(0)
    gen = torch.Generator().manual_seed((0 * 1_000_003 + 0) * 8191 + 0)
    out = trainer.actor.engine.generate(batch.ids, batch.mask, trainer.rollout.sampling, gen)
    assert torch.equal(rollout.sequences, out.sequences[:, :rollout.sequences.shape[1]])
    rec = trainer.train_step(0, 3e-3)
    assert not {"turnsPerEpisode", "toolCalls", "toolTokens", "toolCallFailures"} & set(rec)


def test_a_failed_tool_call_masks_its_episode_out_and_is_counted(tmp_path, monkeypatch):
    """(d) A call the executor fails (it raises, or answers ok=False) ends the episode, which is
    masked out of the loss (no token trained on, no place in its group's statistics, not in
    rewardMean) and counted in toolCallFailures; the other episodes train as usual."""
    trainer = trainer_for(tmp_path, monkeypatch, temperature=0.05, maxTurns=TURNS, maxEpisodeTokens=EPISODE,
                          tools=TOOLS)
    failing = {"s0-1", "s0-6", "s0-11"}

    class Flaky(FunctionTools):
        def step(self, episode_id, call):
            if episode_id in failing:
                raise TimeoutError("sandbox timed out after its retries")
            return super().step(episode_id, call)

    trainer.episodes.executor = Flaky(trainer.episodes.executor.function)
    rollout, stats = trainer.rollout.generate(0)
    tools = stats["tools"]
    called = {f"s0-{r}" for r in range(rollout.rows)
              if (rollout.attention_mask[r] - (rollout.policy_mask[r])).sum() > 0 or not rollout.trained_rows[r]}
    masked = {f"s0-{r}" for r in range(rollout.rows) if not rollout.trained_rows[r]}
    assert masked and masked <= failing and masked <= called
    assert tools.tool_failures == len(masked)
    for r in range(rollout.rows):
        if f"s0-{r}" in masked:  # the episode is there, generated up to its failed call, but trains on nothing
            assert rollout.attention_mask[r, rollout.prompt_len:].sum() > 0
            assert rollout.response_mask[r].sum() == 0
    scored = trainer._score(rollout)
    adv = trainer.estimate(scored, rollout.response_mask.float(), trainer.config.training)["advantages"]
    keep = rollout.trained_rows
    assert adv[~keep].abs().sum() == 0 and adv[keep].abs().sum() > 0  # sampled: the groups have signal
    for g in range(4):  # each group normalised over its episodes that count
        rows = torch.arange(4 * g, 4 * g + 4)
        kept = rows[keep[rows]]
        if len(kept) >= 2:
            s = scored["scores"][kept]
            assert torch.allclose(adv[kept], (s - s.mean()) / (s.std() + 1e-6), atol=1e-5)
    rec = trainer.train_step(0, 3e-3)
    assert rec["toolCallFailures"] == len(masked)
    assert rec["rewardMean"] == pytest.approx(float(scored["scores"][keep].mean()))


def test_the_example_runs_on_cpu(tmp_path, monkeypatch):
    """examples/runtime/grpo-multi-turn-cpu.yaml validates and trains (two steps here), its step
    records carrying the multi-turn fields."""
    import yaml

    from rlkube.runtime.trainers.rl.trainer import train

    torch.set_num_threads(1)
    root = Path(__file__).resolve().parents[2]
    cfg = yaml.safe_load((root / "examples" / "runtime" / "grpo-multi-turn-cpu.yaml").read_text())
    cfg["data"]["source"] = str(root / cfg["data"]["source"])
    cfg["training"]["steps"] = 2
    cfg["checkpoint"]["dir"], cfg["outputDir"] = str(tmp_path / "ckpt"), str(tmp_path / "out")
    result = train(RuntimeConfig.model_validate(cfg))
    assert result.steps_run == 2
    for rec in result.records:
        assert rec["turnsPerEpisode"] >= 1 and rec["toolCallFailures"] == 0
        assert {"toolCalls", "toolTokens", "malformedToolCalls"} <= set(rec)


def test_ppo_trains_on_episodes_with_gae_across_the_tool_turns(tmp_path, monkeypatch):
    """PPO (critic, GAE) on multi-turn episodes: the advantages and returns are 0 on every tool
    token and set on the policy's tokens of every turn (GAE skips the tool turns instead of
    ending the episode at the first one), and a step trains to finite losses."""
    torch.set_num_threads(1)
    cfg = rl_config(tmp_path, "ppo", batching={"globalBatch": 4, "maxMicroBatch": 16, "mode": "fixed"},
                    training={"steps": 1, "lr": 3e-3, "seed": 0},
                    rollout={"maxNewTokens": NEW, "temperature": 1.0, "maxTurns": TURNS,
                             "maxEpisodeTokens": EPISODE, "tools": TOOLS})
    trainer = RLTrainer(RuntimeConfig.model_validate(cfg), DistContext())
    monkeypatch.setattr(multi_turn, "parse_tool_call", lambda text: ToolCall("calculator", {"expression": "6*7"}))
    trainer.rollout.sampling = dataclasses.replace(trainer.rollout.sampling, temperature=0.0)
    batch = trainer.rollout.prompts(0)
    trainer.episodes.decoder.stop_ids = [frequent_token(trainer.actor.model.lm, batch.ids, batch.mask,
                                                        trainer.rollout.sampling)]
    rollout, _ = trainer.rollout.generate(0)
    scored = trainer._score(rollout)
    out = trainer.estimate(scored, rollout.response_mask.float(), trainer.config.training)
    tool = (rollout.episode_mask - rollout.response_mask).bool()
    assert tool.any()
    assert out["advantages"][tool].abs().sum() == 0 and out["returns"][tool].abs().sum() == 0
    # The reward sits on the episode's last token (no KL here), so a first turn that ended the
    # episode would have return 0 at its last token; it bootstraps from the next turn's value instead.
    assert trainer.config.training.kl == 0
    for r in range(rollout.rows):
        if tool[r].any():
            end = runs(rollout.response_mask[r])[0][2]
            assert out["returns"][r, end - 1] != 0 and out["advantages"][r, end - 1] != 0
    rec = trainer.train_step(0, 3e-3)
    assert all(torch.isfinite(torch.tensor(rec[k])) for k in ("loss", "value_loss", "policy_loss"))
    assert rec["toolCalls"] > 0


def two_rank_worker(rank: int, port: int, tmp: str, stop: int, results) -> None:
    import os

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from rlkube.runtime.infra.distributed import init_from_env, shutdown

    multi_turn.parse_tool_call = lambda text: ToolCall("calculator", {"expression": "6*7"})
    cfg = RuntimeConfig.model_validate(multi_turn_config(Path(tmp), actor_gpus=2))
    ctx = init_from_env(cfg.device_map)
    try:
        trainer = RLTrainer(cfg, ctx)
        trainer.rollout.sampling = dataclasses.replace(trainer.rollout.sampling, temperature=0.0)
        trainer.episodes.decoder.stop_ids = [stop]
        rollout, _ = trainer.rollout.generate(0)
        rec = trainer.train_step(0, 3e-3)
        results[rank] = {"sequences": rollout.sequences, "attention": rollout.attention_mask,
                         "policy": rollout.policy_mask, "record": rec}
    finally:
        shutdown(ctx)


def multi_turn_config(tmp: Path, actor_gpus: int = 1) -> dict:
    cfg = rl_config(tmp, "grpo", batching={"globalBatch": 4, "maxMicroBatch": 16, "mode": "fixed"},
                    training={"steps": 1, "lr": 3e-3, "groupSize": 4, "seed": 0},
                    rollout={"maxNewTokens": NEW, "temperature": 1.0, "maxTurns": TURNS, "maxEpisodeTokens": EPISODE,
                             "tools": TOOLS})
    cfg["roles"]["actor"]["gpus"] = actor_gpus
    return cfg


@pytest.mark.timeout(300)
def test_two_actor_ranks_play_the_episodes_of_one_rank(tmp_path, monkeypatch):
    """Two actor ranks (FSDP2 over gloo) each play their half of the episodes; every rank holds
    the whole rollout with its policy mask, equal to one rank's (greedy), and the step record's
    multi-turn fields are summed over the ranks."""
    from .spawned import spawn_ranks

    one = trainer_for(tmp_path / "one", monkeypatch, maxTurns=TURNS, maxEpisodeTokens=EPISODE, tools=TOOLS)
    stop = one.episodes.decoder.stop_ids[0]
    rollout, _ = one.rollout.generate(0)
    want = one.train_step(0, 3e-3)
    assert want["toolCalls"] > 0
    results = spawn_ranks(two_rank_worker, lambda port, results: (port, str(tmp_path / "two"), stop, results),
                          monkeypatch)
    for rank in (0, 1):
        got = results[rank]
        assert torch.equal(got["sequences"], rollout.sequences)
        assert torch.equal(got["attention"], rollout.attention_mask)
        assert torch.equal(got["policy"], rollout.policy_mask)
        for key in ("turnsPerEpisode", "toolCalls", "toolTokens", "toolCallFailures", "responseLengthMean"):
            assert got["record"][key] == pytest.approx(want[key]), key
