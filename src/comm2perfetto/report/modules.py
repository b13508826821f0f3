"""Collectives per nn.Module, with the forward/backward split: CommDebugMode's table, from a real run.

The recorder notes, for every call it records, the dotted path of the module it was issued in
(``MLPModule.net2``: the root module's class, then attribute names, as CommDebugMode prints them) and the pass.
A collective is counted once however many ranks issued it, so on a job whose ranks agree each count equals
what CommDebugMode shows on any one rank; ``ranks`` says how many ranks issued it.

Collectives the recorder never saw from Python (DDP's and FSDP's, issued from C++; known from Flight
Recorder, or on torch 2.4-2.7 with gloo from the dispatcher fallback) have no module: they form one row per op
under ``NOT_SEEN``, so the table adds up to the job's collectives.

>>> aggregate_path("MLPModule.layers.0.attn", 2)
'MLPModule.layers'
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass, field

from comm2perfetto.job import Job
from comm2perfetto.model import Collective, op_family, tensor_bytes
from comm2perfetto.report.bandwidth import first_signature
from comm2perfetto.report_doc import ModuleRow

OUTSIDE = "(outside any module)"
NOT_SEEN = "(issued from C++: DDP, FSDP)"


@dataclass
class _Row:
    instances: dict[Hashable, int] = field(default_factory=dict)  # collective key -> its bytes
    ranks: set[int] = field(default_factory=set)


def aggregate_path(path: str, depth: int | None) -> str:
    """The first ``depth`` components of a dotted module path."""
    if depth is None or depth <= 0:
        return path
    return ".".join(path.split(".")[:depth])


def module_table(job: Job, depth: int | None = None) -> list[ModuleRow]:
    """Rows ``{path, pass, op, count, bytes, ranks}`` in path order (a tree read top-down)."""
    table = ModuleTable(job, depth)
    for uid, cols in job.collectives.items():
        for c in cols:
            table.add(uid, c)
    return table.rows()


class ModuleTable:
    """``module_table`` fed the collectives one at a time (``add``); the recorder's calls are read at once.
    ``steps``: only calls recorded in steps A..B (and only the collectives of those steps are fed)."""

    def __init__(self, job: Job, depth: int | None = None, steps: tuple[int, int] | None = None) -> None:
        rows: dict[tuple[str, str | None, str], _Row] = defaultdict(_Row)
        for rank, log in sorted(job.logs.items()):
            for call in log.calls:
                if call.captured or (steps is not None and not steps[0] <= call.step <= steps[1]):
                    continue  # a captured call runs at each replay of its graph, unseen (report.document notes)
                group = log.groups.get(call.gid)
                # One instance per collective: the group's (name, ranks, seq, op) where numbered, else the call's
                # own.
                key: Hashable = ((group.name, group.ranks, call.seq, call.op)
                                 if call.seq is not None and group is not None else (rank, call.cid))
                if call.from_cpp:  # the dispatcher fallback's (torch 2.4-2.7, gloo): what Flight Recorder shows
                    row = rows[(NOT_SEEN, None, op_family(call.op))]
                else:
                    path = aggregate_path(call.module, depth) if call.module else OUTSIDE
                    row = rows[(path, call.pass_, call.op)]
                # Ranks that disagree on a size (a mismatch) count the lowest rank's, as the collectives table does.
                row.instances.setdefault(key, call.nbytes or 0)
                row.ranks.add(rank)
        self._rows = rows

    def add(self, uid: str, c: Collective) -> None:
        """Count a collective no rank's recorder saw issued from Python."""
        sources = set(c.sources)  # a few distinct values among thousands of ranks
        if not c.joined_ranks or any(s is not None and "log" in s for s in sources):
            return
        if all(s is None or s == "kineto" for s in sources):
            return  # known from profiler traces only: whether Python or C++ issued it is not known
        sig = first_signature(c)
        if sig is None:  # joined ranks always have a signature; a guard for the type checker
            return
        row = self._rows[(NOT_SEEN, None, op_family(sig.op))]
        row.instances[(uid, c.seq)] = tensor_bytes(sig.input_sizes, sig.input_dtypes) or 0
        row.ranks.update(c.joined_ranks)

    def rows(self) -> list[ModuleRow]:
        table: list[ModuleRow] = [{"path": path, "pass": pass_, "op": op, "count": len(row.instances),
                  "bytes": sum(row.instances.values()), "ranks": len(row.ranks)}
                 for (path, pass_, op), row in self._rows.items()]
        table.sort(key=lambda r: (r["path"] in (OUTSIDE, NOT_SEEN), r["path"], r["pass"] or "", r["op"]))
        return table
