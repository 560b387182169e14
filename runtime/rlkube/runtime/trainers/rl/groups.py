"""Which ranks hold which role of an RL job, and the collectives between role groups.

Every role computes on its own ranks, each rank on a contiguous share of the step's rows; the
role's leader (its lowest rank) then broadcasts the result over the job's default group, so
every rank holds the same tensors whatever roles it has. Tensors travel on the device with
NCCL and on the CPU with gloo, and always come back on the CPU.

Without a process group (one process, no torchrun) every role is here and every call is local.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as tdist

from rlkube.runtime.infra.distributed import DistContext


def share(rows: int, ranks: list[int], rank: int) -> slice:
    """The contiguous slice of `rows` that `rank` (a member of `ranks`) takes."""
    per = rows // len(ranks)
    i = ranks.index(rank)
    return slice(i * per, (i + 1) * per)


class RoleGroups:
    """The job's device map seen from this rank."""

    def __init__(self, ctx: DistContext, device_map: dict[str, list[int]] | None) -> None:
        self.ctx = ctx
        self.ranks = dict(device_map or {})
        self.here = set(ctx.roles_here()) if ctx.initialized else set(self.ranks)

    def rows_of(self, rows: int, role: str) -> slice:
        """This rank's share of `rows` among the ranks of `role` (all of them when local)."""
        return share(rows, self.ranks[role], self.ctx.rank) if self.ctx.initialized else slice(0, rows)

    def shares(self, rows: int, role: str) -> tuple[list[slice], int]:
        """Every rank's share of `rows` among the ranks of `role`, and which one is this rank's."""
        if not self.ctx.initialized:
            return [slice(0, rows)], 0
        ranks = self.ranks[role]
        return [share(rows, ranks, r) for r in ranks], ranks.index(self.ctx.rank)

    def leader(self, role: str) -> int:
        return min(self.ranks[role])

    def _comm(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.ctx.device) if self.ctx.backend == "nccl" else t.cpu()

    def broadcast(self, value: torch.Tensor | None, role: str, shape, dtype) -> torch.Tensor:
        """`value` from the role's leader to every rank (the job's default group)."""
        if not self.ctx.initialized:
            return value
        buf = self._comm(value) if self.ctx.rank == self.leader(role) else torch.empty(
            shape, dtype=dtype, device=self.ctx.device if self.ctx.backend == "nccl" else "cpu"
        )
        tdist.broadcast(buf, src=self.leader(role))
        return buf.cpu()

    def gather(self, part: torch.Tensor, role: str) -> torch.Tensor:
        """Concatenate equal-shaped shares of the role's ranks, in rank order (inside the group)."""
        ranks = self.ranks[role]
        if not self.ctx.initialized or len(ranks) == 1:
            return part
        part = self._comm(part.contiguous())
        parts = [torch.empty_like(part) for _ in ranks]
        tdist.all_gather(parts, part, group=self.ctx.group(role))
        return torch.cat(parts).cpu()

    def per_row(
        self, role: str, compute: Callable[[slice], torch.Tensor], rows: int, shape_tail: tuple, dtype: torch.dtype
    ) -> torch.Tensor:
        """`compute(share)` on the role's ranks (each its share of `rows`), gathered, broadcast to all."""
        return self.collect(role, self.compute_here(role, compute, rows), rows, shape_tail, dtype)

    def compute_here(self, role: str, compute: Callable[[slice], torch.Tensor], rows: int) -> torch.Tensor | None:
        """`compute(share)` where this rank holds `role`, else None. Nothing here waits for the
        device: device work `compute` queues is still running when this returns (`collect` waits)."""
        if role in self.here or not self.ctx.initialized:
            return compute(self.rows_of(rows, role))
        return None

    def collect(self, role: str, part: torch.Tensor | None, rows: int, shape_tail: tuple,
                dtype: torch.dtype) -> torch.Tensor:
        """The role's shares (`compute_here`'s results) gathered and broadcast to every rank, on the CPU."""
        value = None if part is None else self.gather(part.to(dtype).cpu(), role)
        return self.broadcast(value, role, (rows, *shape_tail), dtype)

    def sum_in(self, values: list[float], role: str) -> list[float]:
        """Element-wise sum over the ranks of `role` only."""
        if not self.ctx.initialized or len(self.ranks[role]) == 1:
            return list(values)
        t = self._comm(torch.tensor(values, dtype=torch.float64))
        tdist.all_reduce(t, group=self.ctx.group(role))
        return t.cpu().tolist()
