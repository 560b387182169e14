"""The rules of multi-turn rollouts (`rollout.maxTurns`, `rollout.maxEpisodeTokens`,
`rollout.tools`), on the whole spec: each a `Rule` whose Python half refuses the trainer's config
and `rlkube validate`, and whose CEL half goes into the CRD's spec object (`algorithm_settings`
reports them with the other rules across sections). Messages are relative to the spec.

- maxTurns > 1 needs a tool executor (`rollout.tools`): a second turn only ever follows a tool's
  output; and tools need maxTurns > 1, where one turn would never call them.
- `tools` names one executor: exactly one of `function` (in-process) and `remote: true` (the job's
  environment, POST /v1/step), and `remote` needs `roles.environment`.
- Only PPO and GRPO roll out episodes; DPO and KTO learn from fixed data.
- maxEpisodeTokens bounds a multi-turn episode: set only with maxTurns > 1, at least one turn's
  maxNewTokens, and (PPO/GRPO) within data.maxSeqLen with a prompt token and BOS beside it, as
  maxNewTokens is for one turn.
"""

from __future__ import annotations

from typing import Any

from rlkube.runtime.contract.algorithms import ONLINE_ALGORITHMS
from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.sections import DataSpec, RolloutSpec
from rlkube.runtime.contract.spec_cel import ONLINE, spec_field

_TURNS = spec_field("rollout", RolloutSpec, "max_turns")
_NEW_TOKENS = spec_field("rollout", RolloutSpec, "max_new_tokens")
_HAS_TOOLS = "(has(self.rollout) && has(self.rollout.tools))"
_HAS_EPISODE = "(has(self.rollout) && has(self.rollout.maxEpisodeTokens))"


_IS_REMOTE_TOOLS = "(has(self.rollout.tools.remote) && self.rollout.tools.remote)"
_EXECUTOR_COUNT = f"((has(self.rollout.tools.function) ? 1 : 0) + ({_IS_REMOTE_TOOLS} ? 1 : 0))"


def _episode(s: Any) -> int | None:
    return s.rollout.max_episode_tokens


def _executors(s: Any) -> list[str]:
    """The executors `rollout.tools` sets, by wire name (none without tools)."""
    tools = s.rollout.tools
    if tools is None:
        return []
    return [wire for wire, value in (("function", tools.function), ("remote", tools.remote)) if value]


MULTI_TURN_RULES: tuple[Rule, ...] = (
    Rule("rollout.maxTurns: > 1 needs rollout.tools, the tool executor that answers the policy's tool calls "
         "(e.g. tools: {function: 'rlkube.runtime.tools.calculator:calculator'}, or tools: {remote: true} "
         "with roles.environment)",
         f"{_TURNS} <= 1 || {_HAS_TOOLS}",
         lambda s: when(s.rollout.max_turns > 1 and s.rollout.tools is None, f" (maxTurns is {s.rollout.max_turns})"),
         ".rollout.maxTurns"),
    Rule("rollout.tools: needs rollout.maxTurns > 1: with one turn per episode no tool is ever called",
         f"!{_HAS_TOOLS} || {_TURNS} > 1",
         lambda s: when(s.rollout.tools is not None and s.rollout.max_turns <= 1), ".rollout.tools"),
    Rule("rollout.tools: set function (an in-process tool, 'package.module:function') or remote: true (the "
         "environment answers the calls), not both",
         f"!{_HAS_TOOLS} || {_EXECUTOR_COUNT} == 1",
         lambda s: when(s.rollout.tools is not None and len(_executors(s)) != 1,
                        f"; it has {', '.join(_executors(s)) or 'none'}"), ".rollout.tools"),
    Rule("rollout.tools.remote: tool calls answered by the environment need roles.environment",
         f"!{_HAS_TOOLS} || !{_IS_REMOTE_TOOLS} || has(self.roles.environment)",
         lambda s: when(s.rollout.tools is not None and bool(s.rollout.tools.remote) and s.roles.environment is None),
         ".rollout.tools.remote"),
    Rule("rollout.maxTurns: only ppo and grpo roll out episodes; leave it at 1",
         f"{ONLINE} || {_TURNS} == 1",
         lambda s: when(s.algorithm not in ONLINE_ALGORITHMS and s.rollout.max_turns != 1,
                        f" (algorithm is {s.algorithm}, got {s.rollout.max_turns})"),
         ".rollout.maxTurns"),
    Rule("rollout.maxEpisodeTokens: only with maxTurns > 1 (one turn's completion is bounded by maxNewTokens)",
         f"!{_HAS_EPISODE} || {_TURNS} > 1",
         lambda s: when(_episode(s) is not None and s.rollout.max_turns <= 1), ".rollout.maxEpisodeTokens"),
    Rule("rollout.maxEpisodeTokens: must be >= maxNewTokens: an episode holds at least one whole turn",
         f"!{_HAS_EPISODE} || self.rollout.maxEpisodeTokens >= {_NEW_TOKENS}",
         lambda s: when(_episode(s) is not None and _episode(s) < s.rollout.max_new_tokens,
                        f" ({s.rollout.max_new_tokens}, got {_episode(s)})"),
         ".rollout.maxEpisodeTokens"),
    Rule("rollout.maxEpisodeTokens: must be <= data.maxSeqLen - 2: a prompt, its BOS token and the episode "
         "share maxSeqLen tokens",
         f"!{ONLINE} || !{_HAS_EPISODE} || self.rollout.maxEpisodeTokens + 2 <= "
         f"{spec_field('data', DataSpec, 'max_seq_len')}",
         lambda s: when(s.algorithm in ONLINE_ALGORITHMS and _episode(s) is not None
                        and _episode(s) + 2 > s.data.max_seq_len,
                        f" (data.maxSeqLen - 2 = {s.data.max_seq_len - 2}, got {_episode(s)})"),
         ".rollout.maxEpisodeTokens"),
)
