"""torch.distributed from the environment, and one process group per role.

Reads the env of the contract (`rlkube.runtime.contract.pod`, docs/architecture.md "The
contract"; set by the operator, by torchrun, or by launch.py): RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT, and RLKUBE_ATTEMPT for the rendezvous log line. With no RANK and
WORLD_SIZE 1 (a workstation) nothing is initialised and `DistContext.initialized` is False;
every helper here works in that case too, so the trainer has one code path.

Backend: NCCL when CUDA is available, else gloo. Timeouts: a loose one while the gang starts
(pods come up minutes apart, models load), a tight one once training runs, so a rank that hangs
becomes an exit the operator can act on instead of a job that waits forever.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as tdist

from rlkube.runtime.contract.pod import (
    ENV_ATTEMPT,
    ENV_LOCAL_RANK,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_WORLD_SIZE,
    MASTER_PORT,
)
from rlkube.runtime.infra.log import log, setup_logging

START_TIMEOUT = dt.timedelta(seconds=int(os.environ.get("RLKUBE_START_TIMEOUT_S", "1800")))
TRAIN_TIMEOUT = dt.timedelta(seconds=int(os.environ.get("RLKUBE_TRAIN_TIMEOUT_S", "600")))


@dataclass
class DistContext:
    """Where this process sits in the job."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    initialized: bool = False
    groups: dict[str, tdist.ProcessGroup | None] = field(default_factory=dict)
    role_ranks: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def group(self, role: str) -> tdist.ProcessGroup | None:
        """The process group of `role` (None: the default group, or no distributed run)."""
        return self.groups.get(role)

    def sharded(self, role: str) -> bool:
        """Whether `role` is spread over two or more ranks (FSDP shards it: engine/models.shard)."""
        return self.initialized and len(self.role_ranks.get(role, [0])) >= 2

    def roles_here(self) -> list[str]:
        return [r for r, ranks in self.role_ranks.items() if self.rank in ranks]


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment {name}: must be an integer, got {value!r}") from None


def init_from_env(device_map: dict[str, list[int]] | None = None) -> DistContext:
    """Initialise the default process group from the environment and one group per role."""
    rank = env_int(ENV_RANK, 0)
    world = env_int(ENV_WORLD_SIZE, 1)
    local_rank = env_int(ENV_LOCAL_RANK, 0)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    ctx = DistContext(rank=rank, world_size=world, local_rank=local_rank, device=device)
    ctx.role_ranks = {role: list(r) for role, r in (device_map or {"actor": list(range(world))}).items()}
    if world == 1:
        return ctx
    os.environ.setdefault(ENV_MASTER_ADDR, "127.0.0.1")
    os.environ.setdefault(ENV_MASTER_PORT, str(MASTER_PORT))
    kwargs = {"device_id": device} if backend == "nccl" else {}
    # Said before the wait (logging set up first), so a gang stuck in its rendezvous shows
    # in every pod's log who is waiting for whom, and for which restart attempt (a pod of a
    # stale attempt waiting beside the new gang shows as such).
    setup_logging(rank)
    log.info("distributed: rank %d/%d of attempt %s joining %s:%s (%s)", rank, world,
             os.environ.get(ENV_ATTEMPT) or "-", os.environ[ENV_MASTER_ADDR], os.environ[ENV_MASTER_PORT], backend)
    tdist.init_process_group(backend=backend, rank=rank, world_size=world, timeout=START_TIMEOUT, **kwargs)
    ctx.backend, ctx.initialized = backend, True
    # new_group must be called by every rank, for every group, in the same order.
    made: dict[tuple[int, ...], tdist.ProcessGroup | None] = {}
    for role, ranks in ctx.role_ranks.items():
        key = tuple(sorted(ranks))
        if any(r >= world for r in key):
            raise ValueError(f"deviceMap.{role}: ranks {list(key)} exceed WORLD_SIZE {world}")
        if key not in made:
            made[key] = None if len(key) == world else tdist.new_group(list(key), timeout=START_TIMEOUT)
        ctx.groups[role] = made[key]
    log.info("distributed: rank %d/%d backend=%s groups=%s", rank, world, backend, ctx.role_ranks)
    return ctx


def tighten_timeout(ctx: DistContext, timeout: dt.timedelta = TRAIN_TIMEOUT) -> None:
    """Switch from the start-up timeout to the training one (best effort: private torch API)."""
    if not ctx.initialized:
        return
    setter = getattr(tdist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        log.warning("distributed: this torch cannot change a process group's timeout; keeping %s", START_TIMEOUT)
        return
    setter(timeout, None)
    # Only groups this rank belongs to: new_group hands non-members a placeholder that
    # _set_pg_timeout rejects.
    mine = {id(g): g for role, g in ctx.groups.items() if g is not None and ctx.rank in ctx.role_ranks.get(role, [])}
    for group in mine.values():
        setter(timeout, group)


def all_reduce_max(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise max over all ranks (identity on one process)."""
    if not ctx.initialized:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device if ctx.backend == "nccl" else "cpu")
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    """Element-wise sum over all ranks (identity on one process)."""
    if not ctx.initialized:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=ctx.device if ctx.backend == "nccl" else "cpu")
    tdist.all_reduce(t, op=tdist.ReduceOp.SUM)
    return t.tolist()


def barrier(ctx: DistContext) -> None:
    if ctx.initialized:
        tdist.barrier()


def shutdown(ctx: DistContext) -> None:
    if ctx.initialized and tdist.is_initialized():
        tdist.destroy_process_group()
        ctx.initialized = False
