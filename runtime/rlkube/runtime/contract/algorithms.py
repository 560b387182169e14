"""The algorithms rlkube trains, each registered once; every other list of them is derived here.

An algorithm's entry says what the operator and the config need to know of it without torch: its
name (the `algorithm` of the spec: the CRD's enum, the config's `Literal`), the trainer module
that runs it (imported only when a run needs it, so `validate` and the operator stay free of
torch), and whether it learns online, from its own rollouts scored by a reward role (PPO, GRPO),
or offline, from fixed preference data (DPO, KTO), which decides the roles and fields it takes
(`algorithm_settings`). The RL recipes of the torch side (`algorithms/registry.py`: estimator,
loss, critic) are keyed by these names and checked against them when that module loads.

Adding an algorithm: one `register_algorithm` line here, its trainer module (a `train(config,
ctx, hooks)`), and for an online one its recipe in `algorithms/registry.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class AlgorithmEntry:
    """One algorithm of the spec."""

    name: str
    trainer: str  # the module with `train(config, ctx, hooks)`, imported when a run needs it
    online: bool  # learns from its own rollouts and a reward role; else from fixed preference data


ALGORITHMS: dict[str, AlgorithmEntry] = {}


def register_algorithm(name: str, trainer: str, online: bool) -> AlgorithmEntry:
    if name in ALGORITHMS:
        raise ValueError(f"algorithm {name!r} is registered already")
    ALGORITHMS[name] = AlgorithmEntry(name, trainer, online)
    return ALGORITHMS[name]


# In the order the CRD's enum lists them.
register_algorithm("dpo", "rlkube.runtime.trainers.dpo", online=False)
register_algorithm("kto", "rlkube.runtime.trainers.kto", online=False)
register_algorithm("ppo", "rlkube.runtime.trainers.rl", online=True)
register_algorithm("grpo", "rlkube.runtime.trainers.rl", online=True)

ALGORITHM_NAMES: tuple[str, ...] = tuple(ALGORITHMS)
ONLINE_ALGORITHMS: tuple[str, ...] = tuple(name for name, entry in ALGORITHMS.items() if entry.online)
OFFLINE_ALGORITHMS: tuple[str, ...] = tuple(name for name, entry in ALGORITHMS.items() if not entry.online)

# The type of a spec's `algorithm` field (RuntimeConfig, RLTrainingJobSpec): one of the names above.
AlgorithmName = Literal[ALGORITHM_NAMES]  # type: ignore[valid-type]
