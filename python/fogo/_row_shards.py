"""Where the rows of an owner-computed matrix live (fogo.Muon's FSDP2 owner-computes step,
optim.py): the gather to the owner rank and the scatter from it that fogo::muon_step_rows calls
(include/fogo/muon.h, RowExchange), for the matrix's update, its orthogonalized update and, with
NorMuon, its second moment."""

from typing import Optional

import torch


class _RowShards:
    """Where the rows of an owner-computed matrix live (FSDP2's Shard(0) over a 1-D mesh: rows
    laid out as torch.chunk does, ceil(rows / world) a rank, the last ones shorter or empty), for
    fogo::muon_step_rows: its gather to the owner rank and scatter from it. Shards travel padded
    to the same size."""

    def __init__(self, p: torch.Tensor, owner: int):
        mesh = p.device_mesh
        self.group, self.world, self.rank = mesh.get_group(), mesh.size(), mesh.get_local_rank()
        self.owner, self.rows = owner, p.shape[0]
        self.src = torch.distributed.get_global_rank(self.group, owner)
        self.chunk = -(-self.rows // self.world)
        self.first_row = min(self.rank * self.chunk, self.rows)  # where this rank's rows start

    def _padded(self, t: torch.Tensor) -> torch.Tensor:
        out = t.new_zeros((self.chunk,) + tuple(t.shape[1:]))
        out[: t.shape[0]].copy_(t)
        return out

    def gather(self, rows: torch.Tensor) -> Optional[torch.Tensor]:
        """This rank's ``rows`` in; the whole tensor (the matrix, or its second moment) on the
        owner, None elsewhere."""
        padded = self._padded(rows)
        pieces = ([torch.empty_like(padded) for _ in range(self.world)]
                  if self.rank == self.owner else None)
        torch.distributed.gather(padded, pieces, dst=self.src, group=self.group)
        return None if pieces is None else torch.cat(pieces)[: self.rows]

    def scatter(self, whole: Optional[torch.Tensor], out: torch.Tensor) -> None:
        """The owner's ``whole`` tensor (None elsewhere) in; this rank's rows of it into
        ``out``, whose dtype every rank's C++ step chose alike (ns_dtype as it resolves, or
        NorMuon's)."""
        mine = out.new_empty((self.chunk,) + tuple(out.shape[1:]))
        pieces = None
        if whole is not None:
            pieces = [self._padded(piece) for piece in whole.split(self.chunk)]
            pieces += [torch.zeros_like(mine) for _ in range(self.world - len(pieces))]
        torch.distributed.scatter(mine, pieces, src=self.src, group=self.group)
        out.copy_(mine[: out.shape[0]])
