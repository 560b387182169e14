"""`roles`: the job's roles (actor, critic, reward, reference), each with its device group, the
rules on them and `device_map`, the global ranks of each role.

Each rule is a `Rule` written once: its Python half refuses the trainer's config (exit 3) and the
job in `rlkube validate` and the operator, its CEL half goes into the CRD
(`rlkube.operator.api.validation`). `ROLE_SOURCE` sits on one role (gpus or colocateWith),
`ROLES_RULES` on the roles object (`RolesSpec`'s validator; messages relative to the roles,
'critic.colocateWith: ...': the actor's own GPUs, colocation chains, adapters only on the actor);
`SOURCE_RULES` sit on the spec (messages relative to the spec, 'roles.critic.function: ...': a
function or remote only on the reward role, and the reward role's one source: function, model or
remote), so that they are reported
together with the other rules across sections (`algorithm_settings`) and a `RolesSpec` alone may
hold a reward role still to be given its source (placement's tests build such). Each names its
field by `field_path`, so both doors report `spec.roles.critic.colocateWith`. Which roles an
algorithm takes is in `algorithm_settings`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlkube.runtime.contract.rule import Rule, when
from rlkube.runtime.contract.sections.environment_spec import EnvironmentSpec
from rlkube.runtime.contract.sections.model_spec import ModelSpec
from rlkube.runtime.contract.spec import MAX_PATH_LEN, ROLE_NAMES, Spec

OTHER_ROLES = tuple(name for name in ROLE_NAMES if name != "actor")


def colocation_chain(roles: Any, name: str) -> tuple[list[str], bool]:
    """The roles colocateWith leads through from `name`, and whether it ends at a role with gpus
    (the actor counts as one: its own rules refuse it otherwise) through roles that are set,
    without a cycle."""
    chain: list[str] = []
    while name != "actor":
        role = getattr(roles, name)
        if role is None or name in chain:
            return [*chain, name], False
        chain.append(name)
        if role.gpus is not None:
            return chain, True
        if role.colocate_with is None:
            return chain, False
        name = role.colocate_with
    return [*chain, name], True


def _resolves_cel(name: str, visited: frozenset[str]) -> str:
    """CEL twin of `colocation_chain`'s verdict."""
    if name == "actor":
        return "true"
    visited = visited | {name}
    steps = []
    for target in ROLE_NAMES:
        if target in visited:
            continue
        present = "" if target == "actor" else f" && has(self.{target})"
        steps.append(f"(self.{name}.colocateWith == '{target}'{present} && {_resolves_cel(target, visited)})")
    follow = " || ".join(steps) if steps else "false"
    return f"(has(self.{name}.gpus) || (has(self.{name}.colocateWith) && ({follow})))"


def _colocation(name: str) -> tuple[Rule, ...]:
    unset = f"!has(self.{name}) || !has(self.{name}.colocateWith)"
    existing = " || ".join(
        f"self.{name}.colocateWith == '{target}'" + ("" if target == "actor" else f" && has(self.{target})")
        for target in ROLE_NAMES
        if target != name
    )

    def target(roles: Any) -> str | None:
        role = getattr(roles, name)
        return None if role is None else role.colocate_with

    def names_a_set_role(roles: Any) -> bool:
        wanted = target(roles)
        return wanted is not None and wanted != name and (wanted == "actor" or getattr(roles, wanted) is not None)

    def missing(roles: Any) -> str | None:
        wanted = target(roles)
        return when(wanted not in (None, name) and not names_a_set_role(roles),
                    f": got {wanted!r} (set roles: {', '.join(roles.present())})")

    def unresolved(roles: Any) -> str | None:
        # A target that is itself or not set is the two rules above's to report.
        if not names_a_set_role(roles):
            return None
        chain, ends = colocation_chain(roles, name)
        return when(not ends, f": {' -> '.join(chain)}")

    return (
        Rule(f"{name}.colocateWith: a role cannot colocate with itself",
             f"{unset} || self.{name}.colocateWith != '{name}'",
             lambda roles: when(target(roles) == name), f".{name}.colocateWith"),
        Rule(f"{name}.colocateWith: must name a role that is set",
             f"{unset} || self.{name}.colocateWith == '{name}' || {existing}", missing, f".{name}.colocateWith"),
        Rule(f"{name}.colocateWith: the colocateWith chain must end at a role with gpus (no cycles)",
             f"{unset} || self.{name}.colocateWith == '{name}' || !({existing}) || {_resolves_cel(name, frozenset())}",
             unresolved, f".{name}.colocateWith"),
    )


def _lora(name: str) -> Rule:
    return Rule(
        f"{name}.model.lora: only the actor trains adapters (set model.lora)",
        f"!has(self.{name}) || !has(self.{name}.model) || !has(self.{name}.model.lora)",
        lambda roles: when((role := getattr(roles, name)) is not None and role.model is not None
                           and role.model.lora is not None),
        f".{name}.model.lora",
    )


ROLES_RULES: tuple[Rule, ...] = (
    Rule("actor: must have gpus of its own, not colocateWith", "!has(self.actor.colocateWith)",
         lambda roles: when(roles.actor.colocate_with is not None), ".actor"),
    Rule("actor.gpus: must be >= 1 (the actor trains and generates on GPUs of its own)",
         "has(self.actor.gpus) && self.actor.gpus >= 1",
         lambda roles: when((roles.actor.gpus or 0) < 1, f", got {roles.actor.gpus}"), ".actor.gpus"),
    *(rule for name in OTHER_ROLES for rule in _colocation(name)),
    *(_lora(name) for name in OTHER_ROLES),
)


def _function(name: str) -> Rule:
    guard = "" if name == "actor" else f"!has(self.roles.{name}) || "
    return Rule(
        f"roles.{name}.function: only the reward role takes a function",
        f"{guard}!has(self.roles.{name}.function)",
        lambda spec: when((role := getattr(spec.roles, name)) is not None and role.function is not None),
        f".roles.{name}.function",
    )


def _remote(name: str) -> Rule:
    guard = "" if name == "actor" else f"!has(self.roles.{name}) || "
    return Rule(
        f"roles.{name}.remote: only the reward role scores through the environment",
        f"{guard}!has(self.roles.{name}.remote) || !self.roles.{name}.remote",
        lambda spec: when((role := getattr(spec.roles, name)) is not None and bool(role.remote)),
        f".roles.{name}.remote",
    )


def reward_sources(role: Any) -> list[str]:
    """The reward sources `role` sets, by wire name: function, model, remote (none for no role)."""
    if role is None:
        return []
    return [wire for wire, value in (("function", role.function), ("model", role.model), ("remote", role.remote))
            if value]


_IS_REMOTE = "(has(self.roles.reward.remote) && self.roles.reward.remote)"
_SOURCE_COUNT = (f"((has(self.roles.reward.function) ? 1 : 0) + (has(self.roles.reward.model) ? 1 : 0) + "
                 f"({_IS_REMOTE} ? 1 : 0))")

SOURCE_RULES: tuple[Rule, ...] = (
    *(_function(name) for name in ROLE_NAMES if name != "reward"),
    *(_remote(name) for name in ROLE_NAMES if name != "reward"),
    # There is no default reward: the actor's model has no reward head to fall back on.
    Rule("roles.reward: set one of function, model and remote, not several",
         f"!has(self.roles.reward) || {_SOURCE_COUNT} <= 1",
         lambda spec: when(spec.roles.reward is not None and len(reward_sources(spec.roles.reward)) > 1,
                           f"; it has {', '.join(reward_sources(spec.roles.reward))}"), ".roles.reward"),
    Rule("roles.reward: set function (a rule-based reward, 'package.module:function'), model (a reward model) "
         "or remote: true (score through roles.environment)",
         f"!has(self.roles.reward) || {_SOURCE_COUNT} >= 1",
         lambda spec: when(spec.roles.reward is not None and not reward_sources(spec.roles.reward),
                           "; it has none"), ".roles.reward"),
)


ROLE_SOURCE = (
    Rule("exactly one of gpus and colocateWith must be set", "has(self.gpus) != has(self.colocateWith)",
         lambda role: when((role.gpus is None) == (role.colocate_with is None))),
)


class RoleSpec(Spec):
    """One role of the job (actor, critic, reward, reference) and its device group."""

    RULES = ROLE_SOURCE

    gpus: int | None = Field(
        default=None, ge=0, le=4096,
        description="GPUs in this role's own device group. Exactly one of gpus and colocateWith is "
        "set. 0 means the role runs on CPU inside the actor's processes (a rule-based reward, say).",
    )
    colocate_with: Literal["actor", "critic", "reward", "reference"] | None = Field(
        default=None,
        description="Share the device group of the named role instead of having GPUs of its own "
        "(time-shared in one process).",
    )
    model: ModelSpec | None = Field(
        default=None,
        description="This role's own model. Unset: the reference copies the actor's model; the "
        "critic uses the actor's model with a value head; the reward role needs either a model "
        "or a function.",
    )
    function: str | None = Field(
        default=None, max_length=MAX_PATH_LEN, pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*$",
        description="Reward role only: import path 'package.module:function' of a rule-based reward "
        "function(prompt: str, completion: str) -> float, used instead of a reward model.",
    )
    remote: bool | None = Field(
        default=None,
        description="Reward role only: true scores every completion through the job's environment "
        "(roles.environment, POST /v1/score) instead of a function or a model. A call that still fails "
        "after its retries leaves its completion out of the loss; it is never scored as 0.",
    )



class RolesSpec(Spec):
    """The job's roles. The actor is required; which others are allowed depends on the algorithm."""

    RULES = ROLES_RULES

    actor: RoleSpec = Field(description="The policy being trained; it also generates (hybrid engine).")
    critic: RoleSpec | None = Field(default=None, description="Value model (PPO only).")
    reward: RoleSpec | None = Field(
        default=None, description="Reward model, or a rule-based reward function (PPO, GRPO)."
    )
    reference: RoleSpec | None = Field(
        default=None, description="Frozen reference policy for the KL term (DPO, PPO, GRPO)."
    )
    environment: EnvironmentSpec | None = Field(
        default=None,
        description="An environment service of CPU pods (a Deployment and a Service) that scores "
        "completions (roles.reward.remote) and serves episodes, speaking the protocol of "
        "docs/environments.md (PPO, GRPO). It has no GPUs and is not in the device map.",
    )

    def present(self) -> dict[str, RoleSpec]:
        """The roles that are set, in canonical order (actor, critic, reward, reference)."""
        return {name: role for name in ROLE_NAMES if (role := getattr(self, name)) is not None}


    def group_owner(self, name: str) -> str:
        """The role whose GPUs `name` runs on (follows colocateWith to the end)."""
        roles = self.present()
        while roles[name].colocate_with is not None:
            name = roles[name].colocate_with  # type: ignore[assignment]
        return name

    def total_gpus(self) -> int:
        return sum(role.gpus or 0 for role in self.present().values())


def device_map(roles: RolesSpec) -> dict[str, list[int]]:
    """Global GPU ranks of each role: contiguous ranges in canonical role order.

    Roles with their own GPUs get consecutive ranges (actor first); colocated roles get the range
    of the role they colocate with; a role with `gpus: 0` runs on the actor's ranks (on CPU).
    Example: actor 2, critic 1, reward 1, reference colocated with actor ->
    {actor: [0, 1], critic: [2], reward: [3], reference: [0, 1]}.
    """
    present = roles.present()
    ranks: dict[str, list[int]] = {}
    next_rank = 0
    for name, role in present.items():
        if role.gpus:
            ranks[name] = list(range(next_rank, next_rank + role.gpus))
            next_rank += role.gpus
    for name in present:
        if name in ranks:
            continue
        owner = roles.group_owner(name)
        ranks[name] = list(ranks.get(owner, ranks["actor"]))
    return {name: ranks[name] for name in present}
