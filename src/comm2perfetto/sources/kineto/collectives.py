"""The collectives a rank's profiler (Kineto) traces record, ready to be matched across ranks. Never imports torch.

What a trace says about a collective (NCCL or RCCL; recent torch writes the args on both events, torch of
2023 only ids)::

    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 100.0, "dur": 30.0,
     "args": {"External id": 12945, "Collective name": "allreduce", "Seq": 7, "Process Group Name": "0",
              "Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]",
              "In msg nelems": 6637568, "Out msg nelems": 6637568, "dtype": "Float", "Group size": 2}}
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 180.0, "dur": 950.0,
     "args": {"External id": 12945, "correlation": 34915, "device": 0, "stream": 40, ...the same args...}}

One ``TraceCollective`` per communication kernel (``sources/kineto/comm_kernels.py``; the kernels one CPU op launched
count once), tied to the ``record_param_comms`` that launched it by ``External id``: the CPU op's begin is when
the rank issued the collective (its arrival), the kernel's begin and end when the GPU ran it. A trace without
communication kernels (a CPU-only NCCL profile) gives one per ``record_param_comms`` naming a collective, timed
on the CPU. ``wait`` records (``WorkNCCL::wait()``) and point-to-point transfers (``send``/``recv``,
``SendRecv`` kernels) are not collectives: they stay on the GPU streams only. gloo writes no
``record_param_comms`` and runs no kernels: its collectives come from Flight Recorder or the recorder.

A kernel no CPU op names a group for (older torch writes no args on it, or its ``record_param_comms`` is not
tied to it) and whose name says the operation (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, not RCCL's
``ncclDevKernel_Generic``) is a collective of the trace's only process group where ``distributedInfo`` lists
one, the default group of a job that made no other (``only_group``); where it lists several, its group is
unknown::

    "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 128, "pg_count": 1,
                        "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 128,
                                       "ranks": [0, 1, ..., 127]}]}

How they are numbered (``numbering``), per process group:

- ``seq``: the trace's ``Seq`` (torch's collective sequence number, as in Flight Recorder) on every
  collective of the group: matched across ranks, and to Flight Recorder entries, by (group, seq);
- ``order``: older traces have no ``Seq``: collectives are numbered by their place in the rank's trace. Where
  every one was issued inside a ``ProfilerStep#n``, the place is (n, i-th of the group in step n), numbered in
  that order over all ranks (``order_numbers``): ranks whose profilers covered different steps still meet in
  the steps they share. Otherwise the i-th collective of the group in the rank's trace is number i, which
  matches ranks only when every rank's trace starts at the same collective. Never joined to Flight Recorder
  entries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from comm2perfetto.sources.kineto.comm_kernels import ALL_COMM_KERNELS, comm_family, family_op
from comm2perfetto.sources.kineto.events import KinetoCommEvent, KinetoTrace
from comm2perfetto.sources.kineto.steps import launch_steps

SEQ, ORDER = "seq", "order"
UNKNOWN_OP = "collective"  # the op of a kernel whose name does not say it, and that no CPU op names

# record_param_comms' collective names -> the names Flight Recorder gives the same operations.
_OP_NAMES = {"allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "_allgather_base",
             "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "_reduce_scatter_base",
             "alltoall": "all_to_all", "alltoall_base": "all_to_all_base", "all_to_all": "all_to_all",
             "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
             "barrier": "barrier", "allreduce_coalesced": "allreduce_coalesced"}
_NOT_COLLECTIVES = frozenset({"wait", "send", "recv", "recvAnySource", "isend", "irecv"})
# NCCL kernel names -> the operation: ncclDevKernel_AllReduce_Sum_f32_RING_LL, ncclKernel_Broadcast_RING_LL...
_KERNEL_OP = re.compile(r"nccl(?:Dev)?Kernel_(AllReduce|AllGather|ReduceScatter|Broadcast|Reduce|SendRecv|"
                        r"Send|Recv|AllToAll)")
_KERNEL_OPS = {"AllReduce": "all_reduce", "AllGather": "all_gather", "ReduceScatter": "reduce_scatter",
               "Broadcast": "broadcast", "Reduce": "reduce", "AllToAll": "all_to_all", "SendRecv": "send/recv",
               "Send": "send", "Recv": "recv"}
_P2P_OPS = frozenset({"send/recv", "send", "recv"})


@dataclass(frozen=True, slots=True)
class TraceCollective:
    """One collective as one rank's trace records it (times on that rank's clock, ns)."""

    op: str  # Flight Recorder's spelling: "all_reduce"; "collective" when the trace does not say
    seq: int | None  # the trace's Seq, when it has one
    pg_name: str | None  # c10d's group name ("0"), None when the trace does not say (2023 torch)
    pg_desc: str | None
    pg_ranks: tuple[int, ...] | None
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    t_call_ns: int | None  # record_param_comms began: the rank issued it
    t_begin_ns: int  # the kernel began (the CPU op, without a kernel)
    t_end_ns: int
    on_gpu: bool
    kernel: str | None
    step: int | None = None  # the ProfilerStep#n it was issued in (its CPU op's begin, else its kernel's)
    only_group: bool = False  # named by no event: the group is the only one distributedInfo lists
    family: str | None = None  # its kernel's row of comm_kernels.COMM_KERNEL_FAMILIES ("nccl", "deepep" ...)


def shifted(c: TraceCollective, offset_ns: int) -> TraceCollective:
    """``c`` with its times moved by ``offset_ns`` (onto the job's clock)."""
    if not offset_ns:
        return c
    return replace(c, t_call_ns=c.t_call_ns + offset_ns if c.t_call_ns is not None else None,
                   t_begin_ns=c.t_begin_ns + offset_ns, t_end_ns=c.t_end_ns + offset_ns)


def parse_ranks(text: str | None) -> tuple[int, ...] | None:
    """``"[0, 1, 2]"`` -> (0, 1, 2); None for ``"[]"``, absent or unreadable text."""
    if not text:
        return None
    try:
        ranks = tuple(int(x) for x in text.strip("[] ").split(",") if x.strip())
    except ValueError:
        return None
    return ranks or None


def only_group(pg_config: object) -> tuple[str, str | None, tuple[int, ...] | None] | None:
    """(name, description, ranks) of the one process group a trace's ``distributedInfo.pg_config`` lists; None
    where it lists none, several, or none readable.

    >>> only_group([{"pg_name": "0", "pg_desc": "default_pg", "ranks": [0, 1]}])
    ('0', 'default_pg', (0, 1))
    >>> only_group([{"pg_name": "0"}, {"pg_name": "1"}]), only_group("0")
    (None, None)
    """
    if not isinstance(pg_config, list) or len(pg_config) != 1 or not isinstance(pg_config[0], dict):
        return None
    cfg = pg_config[0]
    name, desc, ranks = cfg.get("pg_name"), cfg.get("pg_desc"), cfg.get("ranks")
    if not isinstance(name, str) or not name:
        return None
    readable = isinstance(ranks, list) and ranks and all(type(r) is int and r >= 0 for r in ranks)
    return name, desc if isinstance(desc, str) else None, tuple(ranks) if readable and ranks else None


def op_name(collective: str | None, kernel: str | None) -> str:
    """Flight Recorder's name of an operation from ``Collective name`` or, without it, the kernel's name: NCCL's
    says which collective, a library whose kernels do one (``comm_kernels.family_op``: DeepEP's are all-to-all)
    says it by its family.

    >>> op_name("allreduce", None), op_name(None, "ncclDevKernel_AllGather_RING_LL(...)"), op_name(None, "x")
    ('all_reduce', 'all_gather', 'collective')
    >>> op_name(None, "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*)")
    'all_to_all'
    """
    if collective:
        return _OP_NAMES.get(collective, collective)
    match = _KERNEL_OP.search(kernel or "")
    if match:
        return _KERNEL_OPS[match.group(1)]
    return (family_op(comm_family(kernel)) if kernel else None) or UNKNOWN_OP


def collectives_of(traces: Iterable[KinetoTrace]) -> list[TraceCollective]:
    """Every collective of one rank's traces, in issue order."""
    out: list[TraceCollective] = []
    for trace in traces:
        cols = _collectives(trace.comm_events)
        only = only_group(trace.pg_config)
        if only is not None:
            name, desc, ranks = only
            # not a library's kernels (DeepEP's): they communicate outside any process group
            cols = [c if c.pg_name is not None or c.op == UNKNOWN_OP or family_op(c.family) is not None else
                    replace(c, pg_name=name, pg_desc=desc, pg_ranks=ranks, only_group=True) for c in cols]
        if trace.steps:
            steps = launch_steps(trace.steps, {}, ((None, c.t_call_ns if c.t_call_ns is not None else c.t_begin_ns)
                                                   for c in cols))
            cols = [replace(c, step=n) for c, n in zip(cols, steps)]
        out.extend(cols)
    out.sort(key=lambda c: (c.t_call_ns if c.t_call_ns is not None else c.t_begin_ns, c.t_begin_ns))
    return out


def _collectives(events: Sequence[KinetoCommEvent]) -> list[TraceCollective]:
    launchers = {e.external_id: e for e in events
                 if e.name == "record_param_comms" and e.external_id is not None and not e.on_gpu}
    kernels: dict[int | tuple[str, int], list[KinetoCommEvent]] = {}
    for e in events:
        if e.on_gpu and ALL_COMM_KERNELS.search(e.name):
            # kernels one CPU op launched are one collective; a kernel tied to no op is one on its own
            key = e.external_id if e.external_id in launchers else ("kernel", id(e))
            kernels.setdefault(key, []).append(e)
    out = []
    if kernels:
        for key, group in kernels.items():
            cpu = launchers.get(key) if not isinstance(key, tuple) else None
            c = _collective(cpu, group)
            if c is not None:
                out.append(c)
        return out
    for cpu in launchers.values():  # no kernels: the CPU ops alone
        c = _collective(cpu, [])
        if c is not None:
            out.append(c)
    return out


def _collective(cpu: KinetoCommEvent | None, kernels: list[KinetoCommEvent]) -> TraceCollective | None:
    """One collective from its CPU op and kernels (either may be missing); None when it is not one."""
    first = kernels[0] if kernels else cpu
    assert first is not None

    def arg(name: str):  # the kernel's args first (the CPU op may be a bare 2023 one), then the op's
        for e in (*kernels, cpu):
            value = getattr(e, name) if e is not None else None
            if value is not None:
                return value
        return None

    collective = arg("collective")
    if collective in _NOT_COLLECTIVES or (cpu is not None and not kernels and collective is None):
        return None
    op = op_name(collective, first.name if kernels else None)
    if op in _P2P_OPS:
        return None
    if kernels:
        begin, end = min(k.t_begin_ns for k in kernels), max(k.t_end_ns for k in kernels)
    else:
        assert cpu is not None
        begin, end = cpu.t_begin_ns, cpu.t_end_ns
    return TraceCollective(
        op=op, seq=arg("seq"), pg_name=arg("pg_name"), pg_desc=arg("pg_desc"), pg_ranks=parse_ranks(arg("pg_ranks")),
        in_nelems=arg("in_nelems"), out_nelems=arg("out_nelems"), dtype=arg("dtype"),
        t_call_ns=cpu.t_begin_ns if cpu is not None else None, t_begin_ns=begin, t_end_ns=end,
        on_gpu=bool(kernels), kernel=first.name if kernels else None,
        family=comm_family(first.name) if kernels else None,
    )


def numbered(cols: Sequence[TraceCollective]) -> tuple[str, list[int] | list[tuple[int, int]]]:
    """How one rank's collectives of one group are numbered (``SEQ`` or ``ORDER``, see the module's
    docstring) and, in order, their ``Seq``, or their places for ``order_numbers``: (step, i-th in the step)
    where every one has a step, else (0, i-th)."""
    seqs = [c.seq for c in cols if c.seq is not None]
    if cols and len(seqs) == len(cols):
        return SEQ, seqs
    steps = [c.step for c in cols if c.step is not None]
    if cols and len(steps) == len(cols):
        seen: dict[int, int] = {}
        places = []
        for step in steps:
            i = seen[step] = seen.get(step, -1) + 1
            places.append((step, i))
        return ORDER, places
    return ORDER, [(0, i) for i in range(len(cols))]


def order_numbers(places: Iterable[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """Every rank's places (see ``numbered``) of one group -> numbers from 1, in (step, i) order.

    >>> order_numbers([(5, 0), (5, 1), (6, 0), (6, 0), (4, 0)])
    {(4, 0): 1, (5, 0): 2, (5, 1): 3, (6, 0): 4}
    """
    return {place: n for n, place in enumerate(sorted(set(places)), 1)}
