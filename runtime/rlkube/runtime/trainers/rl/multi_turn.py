"""Multi-turn rollouts (rollout.maxTurns > 1): the actor plays each prompt out as an episode,
answering its tool calls with the tool executor between turns (docs/multi-turn.md).

The engine's `EpisodeDecoder` generates turn by turn and asks, between turns, what to append to
each row whose turn ended at the closing tool-call tag; this module answers: it decodes the
turn, parses its call (tools/calls.py), steps the executor (`ToolExecutor.step(episode_id,
call)`; the calls of the rows whose turns ended together at once where the executor can:
`tools.step_all`), and returns the tool turn's tokens (tools/turns.py). The executor is
`rollout.tools.function`'s in-process one, or the job's environment for `rollout.tools.remote`.
A malformed call is the policy's mistake: it is answered with the parse error as the tool's
output, and counted. A call the
executor fails (it raises, or answers ok=False) ends the episode, which is then masked out of
the loss (its policy mask is zeroed: no token of it is trained on, and GRPO leaves it out of its
group's statistics) and counted, never scored as 0: its reward would say nothing about the
policy. A result with `done` ends the episode at the call.

Episode ids are 's<step>-<row>' with the row's index in the step's rollout, and 'e<block>-<row>'
for evaluations (blocks of eval prompts numbered across the run): unique within a run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlkube.runtime.contract.config import RuntimeConfig
from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.engine.episodes import EpisodeDecoder, EpisodeOutput
from rlkube.runtime.engine.hybrid_engine import HybridEngine
from rlkube.runtime.engine.sampling import SamplingParams
from rlkube.runtime.infra.errors import ConfigError
from rlkube.runtime.infra.log import log
from rlkube.runtime.tools import (
    TOOL_CALL_CLOSE,
    MalformedToolCall,
    ToolExecutor,
    ToolTurnFormat,
    load_tool_executor,
    parse_tool_call,
    step_all,
)
from rlkube.runtime.tools.environment import connect_environment_tools


@dataclass
class ToolStats:
    """What one rank's episodes of a rollout did; summed over ranks in the step record."""

    episodes: int = 0
    turns: int = 0  # assistant turns, all episodes
    tool_calls: int = 0  # calls that parsed and went to the executor
    tool_failures: int = 0  # calls the executor failed: each masks its episode out of the loss
    malformed_calls: int = 0  # calls that did not parse, answered with the error
    tool_tokens: int = 0  # appended tokens (tool turns), attended to but not trained on
    tool_retries: int = 0  # calls a remote executor retried (rollout.tools.remote)

    def fields(self) -> list[float]:
        return [self.episodes, self.turns, self.tool_calls, self.tool_failures, self.malformed_calls,
                self.tool_tokens, self.tool_retries]


# The step record's multi-turn fields as rank 0's /metrics gauges rlkube_<name> (docs/metrics.md)
MULTI_TURN_GAUGES = {"turnsPerEpisode": "turns_per_episode", "toolCalls": "tool_calls",
                     "toolCallFailures": "tool_call_failures", "malformedToolCalls": "malformed_tool_calls",
                     "toolTokens": "tool_tokens", "toolCallRetries": "tool_call_retries"}


def record_fields(totals: list[float]) -> dict:
    """The step record's multi-turn fields from `ToolStats.fields` summed over ranks."""
    episodes, turns, calls, failures, malformed, tool_tokens, retries = totals
    return {"turnsPerEpisode": turns / episodes if episodes else 0.0, "toolCalls": int(calls),
            "toolCallFailures": int(failures), "malformedToolCalls": int(malformed), "toolTokens": int(tool_tokens),
            "toolCallRetries": int(retries)}


class MultiTurnEpisodes:
    """The actor's episode generation: the episode decoder over its hybrid engine, the tool
    executor, and the tool turn's format."""

    def __init__(self, config: RuntimeConfig, tokenizer: Tokenizer, engine: HybridEngine,
                 executor: ToolExecutor | None = None) -> None:
        """`executor`: the tool executor (rollout.tools' when None: the job's environment for
        `remote`, before step 1, else the in-process function)."""
        rollout = config.rollout
        if executor is None and rollout.tools.remote:
            executor = connect_environment_tools(config.roles.environment.client)
        elif executor is None:
            try:
                executor = load_tool_executor(rollout.tools.function)
            except ValueError as e:
                raise ConfigError(str(e)) from None
        self.executor, self.tokenizer, self.engine = executor, tokenizer, engine
        self.format = ToolTurnFormat.of(tokenizer)
        if self.format.source != "template":
            log.warning("rollout.tools: the tokenizer's chat template has no tool role; tool outputs are appended "
                        "as %s turns (docs/multi-turn.md)", self.format.source)
        self.decoder = EpisodeDecoder(engine.decoder, rollout.max_turns, rollout.episode_tokens,
                                      stop_ids=tokenizer.encode(TOOL_CALL_CLOSE))

    def generate(self, ids: torch.Tensor, mask: torch.Tensor, params: SamplingParams, generator: torch.Generator,
                 episode_prefix: str, first_row: int = 0) -> tuple[EpisodeOutput, ToolStats]:
        """The episodes of the prompt rows `ids`/`mask` (rows first_row.. of the rollout), their
        policy masks zeroed where a tool call failed, and what they did."""
        stats, failed = ToolStats(), set()

        def between(rows: list[int], turns: list[list[int]]) -> list[list[int] | None]:
            return self._answer([f"{episode_prefix}-{first_row + row}" for row in rows], rows, turns, stats, failed)

        if self.engine.generating:
            out = self.decoder.generate(ids, mask, params, between, generator, self.engine.decoder.batch_rows)
        else:
            with self.engine.generation_mode():
                out = self.decoder.generate(ids, mask, params, between, generator, self.engine.decoder.batch_rows)
        stats.episodes = len(out.turns)
        stats.turns = sum(out.turns)
        stats.tool_tokens = int((out.response_mask - out.policy_mask).sum())
        if failed:
            out.policy_mask[sorted(failed)] = 0
        take = getattr(self.executor, "take_stats", None)  # a remote executor's client counts its calls
        if take is not None:
            stats.tool_retries = int(take()["envRetries"])
        return out, stats

    def _answer(self, episode_ids: list[str], rows: list[int], turns: list[list[int]], stats: ToolStats,
                failed: set[int]) -> list[list[int] | None]:
        """The tool turns appended after `turns` (None: the episode ends), their calls made together."""
        out: list[list[int] | None] = [None] * len(turns)
        calls = []
        for i, turn in enumerate(turns):
            try:
                calls.append((i, parse_tool_call(self.tokenizer.decode(turn))))
            except MalformedToolCall as e:
                stats.malformed_calls += 1
                out[i] = self.format.tokens(self.tokenizer, f"error: malformed tool call: {e}")
        stats.tool_calls += len(calls)
        results = step_all(self.executor, [(episode_ids[i], call) for i, call in calls])
        for (i, _), result in zip(calls, results, strict=True):
            if not result.ok:
                stats.tool_failures += 1
                failed.add(rows[i])
            elif not result.done:
                out[i] = self.format.tokens(self.tokenizer, result.text)
        return out
