"""What one rank of an all-to-all sends to and expects from each peer: model data the event log reader builds
and ``model.Signature`` carries, in a module of its own so that the readers and the model both import it (no
torch).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Exchange"]


@dataclass(frozen=True, slots=True)
class Exchange:
    """One rank's side of an all-to-all, as the recorder saw the call: the elements it sends to each member of
    its group and the elements it expects from each, in group-rank order (the group's sorted global ranks).
    ``send_given``/``recv_given``: the split sizes were passed (``input_split_sizes``, ``output_split_sizes``;
    ``all_to_all``'s one tensor per peer); False: not given, so torch splits dim 0 evenly across the group,
    which these counts are. None where that cannot be told (a dim 0 the group size does not divide).

    >>> Exchange(send=(3, 2), recv=(3, 2)).sends_to(1), Exchange(send=(3, 2), recv=(3, 2)).expects_from(1)
    (2, 2)
    """

    send: tuple[int, ...] | None
    recv: tuple[int, ...] | None
    send_given: bool = True
    recv_given: bool = True

    def sends_to(self, group_rank: int) -> int | None:
        """Elements this rank sends to the member at ``group_rank``; None when not known."""
        return self.send[group_rank] if self.send is not None and 0 <= group_rank < len(self.send) else None

    def expects_from(self, group_rank: int) -> int | None:
        """Elements this rank expects from the member at ``group_rank``; None when not known."""
        return self.recv[group_rank] if self.recv is not None and 0 <= group_rank < len(self.recv) else None
