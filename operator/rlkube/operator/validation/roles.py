"""Rules on the roles: which roles an algorithm takes, colocation chains, GPU sums, and how a
colocated critic splits a mini-batch.

The Python checks of the first three live with the models the runtime shares
(`rlkube.runtime.contract.config`: `RolesSpec`, `RoleSpec`, `validate_algorithm_roles`), since the
trainer validates its config without the operator; their CEL is here. The colocated critic's rule
is the operator's alone and has both halves here.
"""

from __future__ import annotations

from typing import Any

from rlkube.operator.validation.cel import (
    OFFLINE,
    ONLINE,
    gpus_per_pod,
    mini_batches,
    role_gpus,
    rows,
    rule,
    total_gpus,
)
from rlkube.runtime.contract.config import ROLE_NAMES, device_map

_OTHER_ROLES = tuple(name for name in ROLE_NAMES if name != "actor")


def _resolves(name: str, visited: frozenset[str]) -> str:
    """CEL: following colocateWith from role `name` ends at a role with gpus, without a cycle."""
    if name == "actor":
        return "true"
    visited = visited | {name}
    steps = []
    for target in ROLE_NAMES:
        if target in visited:
            continue
        present = "" if target == "actor" else f" && has(self.{target})"
        steps.append(f"(self.{name}.colocateWith == '{target}'{present} && {_resolves(target, visited)})")
    follow = " || ".join(steps) if steps else "false"
    return f"(has(self.{name}.gpus) || (has(self.{name}.colocateWith) && ({follow})))"


def _other_role_rules(name: str) -> list[dict]:
    unset = f"!has(self.{name}) || !has(self.{name}.colocateWith)"
    existing = " || ".join(
        f"self.{name}.colocateWith == '{target}'" + ("" if target == "actor" else f" && has(self.{target})")
        for target in ROLE_NAMES
        if target != name
    )
    rules = [
        rule(f"{unset} || self.{name}.colocateWith != '{name}'",
             f"roles.{name}.colocateWith: a role cannot colocate with itself", f".{name}"),
        rule(f"{unset} || {existing}", f"roles.{name}.colocateWith: must name a role that is set", f".{name}"),
        rule(f"!has(self.{name}) || {_resolves(name, frozenset())}",
             f"roles.{name}.colocateWith: the colocateWith chain must end at a role with gpus (no cycles)",
             f".{name}"),
        rule(f"!has(self.{name}) || !has(self.{name}.model) || !has(self.{name}.model.lora)",
             f"roles.{name}.model.lora: only the actor trains adapters (set model.lora)", f".{name}"),
    ]
    if name != "reward":
        rules.append(rule(f"!has(self.{name}) || !has(self.{name}.function)",
                          f"roles.{name}.function: only the reward role takes a function", f".{name}"))
    return rules


def roles_cel() -> list[dict]:
    """CEL on RolesSpec: the twins of RolesSpec._colocation and the reward role's source rules."""
    rules = [
        rule("!has(self.actor.colocateWith)", "roles.actor: must have gpus of its own, not colocateWith", ".actor"),
        rule("has(self.actor.gpus) && self.actor.gpus >= 1",
             "roles.actor.gpus: must be >= 1 (the actor trains and generates on GPUs of its own)", ".actor"),
        rule("!has(self.actor.function)", "roles.actor.function: only the reward role takes a function", ".actor"),
    ]
    for name in _OTHER_ROLES:
        rules += _other_role_rules(name)
    return [
        *rules,
        rule("!has(self.reward) || !has(self.reward.function) || !has(self.reward.model)",
             "roles.reward: set model or function, not both", ".reward"),
        rule("!has(self.reward) || has(self.reward.function) || has(self.reward.model)",
             "roles.reward: set function (a rule-based reward, 'package.module:function') or model "
             "(a reward model)", ".reward"),
    ]


def spec_roles_cel() -> list[dict]:
    """CEL on the spec: the roles' GPU sum, gpusPerPod, and validate_algorithm_roles' rules."""
    total, per_pod = total_gpus(), gpus_per_pod()
    return [
        rule(f"{total} >= 1", "roles: the roles' gpus must add up to >= 1", ".roles"),
        # gpusPerPod < 1 is refused by its own minimum; the guard keeps CEL from dividing by 0.
        rule(f"{per_pod} < 1 || {total} % {per_pod} == 0",
             "placement.gpusPerPod: the job's total GPUs (the sum of the roles' gpus) must be a "
             "multiple of gpusPerPod", ".placement"),
        rule("self.algorithm == 'ppo' || !has(self.roles.critic)", "roles.critic: only ppo uses a critic", ".roles"),
        rule("self.algorithm != 'ppo' || has(self.roles.critic)", "roles.critic: ppo needs a critic role", ".roles"),
        rule(f"{OFFLINE} || has(self.roles.reward)",
             "roles.reward: ppo and grpo need a reward role (a model or a function)", ".roles"),
        rule(f"!{OFFLINE} || !has(self.roles.reward)",
             "roles.reward: dpo and kto learn from preference data and use no reward role", ".roles"),
    ]


# -- a colocated critic's mini-batch split: Python and CEL ----------------------------------------

COLOCATED_CRITIC = ("training.miniBatches: a mini-batch (rows per step / miniBatches) must split evenly over "
                    "the GPUs the critic shares with the role it colocates with")


def colocated_critic_problems(spec: Any) -> list[str]:
    """PPO/GRPO: a mini-batch splits evenly over the critic's ranks also where the critic has no
    GPUs of its own and shares another role's group (critic -> reward, say): the trainer checks the
    ranks each role runs on (rl/trainer.py _check_divisible), `algorithm_settings.batch_split_problems`
    only the roles with GPUs of their own."""
    critic = spec.roles.critic
    if spec.algorithm not in ("ppo", "grpo") or critic is None or critic.gpus is not None:
        return []
    group = spec.training.group_size if spec.algorithm == "grpo" else 1
    step_rows, minis = spec.batching.global_batch * group, spec.training.mini_batches
    gpus = len(device_map(spec.roles)["critic"])
    if step_rows % minis or (step_rows // minis) % gpus == 0:
        return []
    return [
        f"training.miniBatches: a mini-batch of {step_rows // minis} rows must split evenly over the {gpus} GPUs "
        f"the critic shares with role {spec.roles.group_owner('critic')} (colocateWith {critic.colocate_with})"
    ]


def group_gpus_cel(name: str, visited: frozenset[str] = frozenset()) -> str:
    """CEL: the GPUs of the group role `name` runs on (device_map's ranks): its own gpus, the
    actor's for gpus 0, else those of the role colocateWith leads to; 0 where a role is missing."""
    actor = role_gpus("actor")
    if name == "actor":
        return actor
    role = f"self.roles.{name}"
    follow = "".join(
        f"{role}.colocateWith == '{target}' ? {group_gpus_cel(target, visited | {name})} : "
        for target in ROLE_NAMES
        if target != name and target not in visited
    )
    own = f"({role}.gpus > 0 ? {role}.gpus : {actor})"
    return f"(has({role}) ? (has({role}.gpus) ? {own} : (has({role}.colocateWith) ? ({follow}0) : 0)) : 0)"


def colocated_critic_cel() -> dict:
    step_rows, minis, critic = rows(), mini_batches(), group_gpus_cel("critic")
    return rule(
        f"!{ONLINE} || !has(self.roles.critic) || has(self.roles.critic.gpus) || {step_rows} % {minis} != 0 "
        f"|| {critic} == 0 || ({step_rows} / {minis}) % {critic} == 0",
        COLOCATED_CRITIC,
        ".training",
    )
