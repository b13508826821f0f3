"""Per (op, process group) of all-to-alls: the bytes each member sent to each member, summed over the collectives
the report covers, as a matrix (``report_doc.ExchangeRow``).

A rank's side of one all-to-all comes from ``model.peer_bytes``: the recorder's split sizes, or Flight
Recorder's one tensor per peer (``all_to_all``'s lists). A collective counts in the matrix (``covered``) when
every member's sends are known and agree with what each receiver expected from it, where that is known: an
all-to-all whose ranks disagree moved nothing one can count (gloo aborts a rank), and ``diagnose`` names the
pair (``disagreeing`` counts them here). A matrix is the senders' row by the receivers' column, in the group's
rank order (its sorted global ranks)::

    {"op": "all_to_all_single", "process_group": "default_pg", "group_uid": "0", "ranks": [0, 1], "count": 3,
     "covered": 3, "disagreeing": 0, "sent_bytes": [[24, 48], [12, 36]], "received_bytes": [36, 84],
     "imbalance": 1.4, "hot_ranks": [1], "time_s": [0.0021, 0.0019]}

``received_bytes`` are the columns' sums, ``imbalance`` their max over their mean (1.0 when even; None when
nothing was received), ``hot_ranks`` the ranks that receive that max where it is above the mean (the hot
expert's; [] when even), ``time_s``
each member's time in the covered collectives (its GPU work, or its call where the CPU runs it: as
``Collective.work_of`` says), None where one of them is not timed. No source times an all-to-all per peer
(one call, one kernel), so there is no per-pair time. Groups larger than ``MAX_MATRIX_RANKS`` get no matrix: a
note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from comm2perfetto.intervals import NS
from comm2perfetto.job import Job
from comm2perfetto.model import Collective, op_family, peer_bytes
from comm2perfetto.report.bandwidth import first_signature
from comm2perfetto.report_doc import ExchangeRow

__all__ = ["MAX_MATRIX_RANKS", "ExchangeTable"]

MAX_MATRIX_RANKS = 512  # a matrix of n^2 cells per collective: 512 ranks is 262,144 additions each


@dataclass
class _Matrix:
    """One (op, group)'s running sums: bytes per (sender, receiver) position and each member's time (None once
    one of its covered collectives is untimed)."""

    members: list[int]
    count: int = 0
    covered: int = 0
    disagreeing: int = 0
    sent: list[list[int]] = field(init=False)
    time_ns: list[int | None] = field(init=False)

    def __post_init__(self) -> None:
        n = len(self.members)
        self.sent = [[0] * n for _ in range(n)]
        self.time_ns = [0] * n


class ExchangeTable:
    """The all-to-all matrices, fed one collective at a time (``add``) in report's one pass over the job."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._rows: dict[tuple[str, str], _Matrix] = {}
        self._too_large: set[str] = set()
        self._all_to_all: dict[str, bool] = {}

    def add(self, uid: str, c: Collective) -> None:
        sig = first_signature(c)
        if sig is None:
            return
        is_all_to_all = self._all_to_all.get(sig.op)
        if is_all_to_all is None:  # decided once per op name: this runs for every collective of the job
            is_all_to_all = self._all_to_all[sig.op] = op_family(sig.op) == "all_to_all"
        if not is_all_to_all:
            return
        members = sorted(self._job.groups[uid].ranks)
        n = len(members)
        if n > MAX_MATRIX_RANKS:
            self._too_large.add(uid)
            return
        row = self._rows.get((sig.op, uid))
        if row is None:
            row = self._rows[(sig.op, uid)] = _Matrix(members)
        row.count += 1
        sent: list[tuple[int, ...]] = []
        expected: list[tuple[int, ...] | None] = []
        for r in members:
            try:
                i = c.index_of(r)
            except ValueError:  # a rank not read (--sample)
                return
            s = c.signatures[i]
            send, expect = peer_bytes(s, n) if s is not None else (None, None)
            if send is None:
                return
            sent.append(send)
            expected.append(expect)
        if any(e is not None and e[a] != sent[a][b] for a in range(n) for b, e in enumerate(expected)):
            row.disagreeing += 1
            return
        row.covered += 1
        for a, send in enumerate(sent):
            cells = row.sent[a]
            for b, k in enumerate(send):
                cells[b] += k
        for a, r in enumerate(members):
            begin, end = c.work_of(c.index_of(r))
            spent = row.time_ns[a]
            row.time_ns[a] = spent + (end - begin) if spent is not None and begin is not None and end is not None \
                else None

    def rows(self) -> list[ExchangeRow]:
        """One row per (op, group) that issued all-to-alls, the most bytes first."""
        groups = self._job.groups
        table = [_render(op, uid, groups[uid].label, m) for (op, uid), m in self._rows.items()]
        table.sort(key=lambda r: (-sum(r["received_bytes"]), r["op"], r["process_group"]))
        return table

    def notes(self) -> list[str]:
        return [f"all-to-alls on {self._job.groups[uid].label} ({len(self._job.groups[uid].ranks):,} ranks): no "
                f"per-peer matrix above {MAX_MATRIX_RANKS} ranks" for uid in sorted(self._too_large)]


def _render(op: str, uid: str, label: str, m: _Matrix) -> ExchangeRow:
    received = [sum(row[b] for row in m.sent) for b in range(len(m.members))]
    total = sum(received)
    top = max(received, default=0)
    mean = total / len(received) if received else 0
    return {
        "op": op, "process_group": label, "group_uid": uid, "ranks": m.members, "count": m.count,
        "covered": m.covered, "disagreeing": m.disagreeing, "sent_bytes": m.sent, "received_bytes": received,
        "imbalance": top / mean if total else None,
        "hot_ranks": [r for r, k in zip(m.members, received) if k == top > mean],
        "time_s": [t * NS if t is not None and m.covered else None for t in m.time_ns],
    }
