"""The GPU time of a rank's point-to-point batches, from its profiler (Kineto) traces. Never imports torch.

NCCL runs a ``batch_isend_irecv`` (or any send and recv coalesced together) as one ``SendRecv`` kernel, launched
inside the ``nccl:coalesced`` annotation c10d opens when it ends the batch. Recent torch ties neither to the
other: the kernel carries no ``External id`` (its launch is a driver call, ``cuLaunchKernelEx``), only the copy
of the annotation Kineto projects onto the stream does::

    {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "ts": 273037.082, "dur": 43.802, "args": {"External id": 31}}
    {"ph": "X", "cat": "cpu_op", "name": "c10d::recv_", "ts": 273090.052, "dur": 21.769, "args": {"External id": 33}}
    {"ph": "X", "cat": "user_annotation", "name": "nccl:coalesced", "ts": 273117.986, "dur": 52.865,
     "args": {"External id": 35}}
    {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
     "ts": 273157.836, "dur": 3.327, "args": {"stream": 16, "correlation": 1326}}

So a rank's ``SendRecv``/``Send``/``Recv`` kernels are joined to its ``nccl:coalesced`` annotations by
``External id`` where a kernel has one, and the rest by order: the i-th kernel to the i-th annotation, only
where their counts agree and each annotation began before its kernel (else none is joined: no guess). A batch's
ops are those the rank issued from the first ``c10d::send``/``c10d::recv_`` after the previous batch to the end
of its annotation (``P2PBatch.issued_ns``, ``call_end_ns``); ``match`` gives them the kernel's time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from comm2perfetto.sources.kineto.classify import GPU_ANNOTATION_KIND, normalise_kind
from comm2perfetto.sources.kineto.collectives import op_name
from comm2perfetto.sources.kineto.comm_kernels import ALL_COMM_KERNELS
from comm2perfetto.sources.kineto.events import KinetoCommEvent, KinetoTrace

__all__ = ["COALESCED", "P2PBatch", "p2p_batches"]

COALESCED = "nccl:coalesced"
_P2P_KERNEL_OPS = frozenset({"send/recv", "send", "recv"})
_P2P_CALLS = ("c10d::send", "c10d::recv")  # c10d::recv_, c10d::recv_any_source_ too


@dataclass(frozen=True, slots=True)
class P2PBatch:
    """One batch of sends and recvs: when the rank issued its ops (its clock, ns) and when its kernel ran."""

    issued_ns: int  # the first c10d::send/recv of the batch began (the annotation's begin, without one)
    call_end_ns: int  # the nccl:coalesced annotation ended: every op of the batch was issued
    t_begin_ns: int
    t_end_ns: int

    def holds(self, t_ns: int | None) -> bool:
        """Whether an op issued at ``t_ns`` belongs to the batch."""
        return t_ns is not None and self.issued_ns <= t_ns <= self.call_end_ns


def p2p_batches(traces: Iterable[KinetoTrace]) -> list[P2PBatch]:
    """Every point-to-point batch of one rank's traces whose kernel is known, in issue order."""
    out: list[P2PBatch] = []
    for trace in traces:
        out += _batches(trace.comm_events)
    return sorted(out, key=lambda b: b.call_end_ns)


def _batches(events: Sequence[KinetoCommEvent]) -> list[P2PBatch]:
    # the CPU's annotations, not the copies Kineto projects onto the stream (which carry the same External id)
    annotations = sorted((e for e in events if e.name == COALESCED and not e.on_gpu
                          and normalise_kind(e.category) != GPU_ANNOTATION_KIND), key=lambda e: e.t_begin_ns)
    kernels = sorted((e for e in events if e.on_gpu and ALL_COMM_KERNELS.search(e.name)
                      and op_name(None, e.name) in _P2P_KERNEL_OPS), key=lambda e: e.t_begin_ns)
    by_id = {e.external_id: e for e in annotations if e.external_id is not None}
    joined = [(by_id[k.external_id], k) for k in kernels if k.external_id in by_id]
    tied = {id(e) for pair in joined for e in pair}
    rest_a = [a for a in annotations if id(a) not in tied]
    rest_k = [k for k in kernels if id(k) not in tied]
    if len(rest_a) == len(rest_k) and all(a.t_begin_ns <= k.t_begin_ns for a, k in zip(rest_a, rest_k)):
        joined += zip(rest_a, rest_k)
    kernel_of = {id(a): k for a, k in joined}
    calls = sorted(e.t_begin_ns for e in events if e.name.startswith(_P2P_CALLS) and not e.on_gpu)
    out = []
    previous_end = None  # of the annotation before, joined or not: the calls after it are the next batch's
    for a in annotations:
        k = kernel_of.get(id(a))
        if k is not None:
            mine = [t for t in calls if t <= a.t_begin_ns and (previous_end is None or t > previous_end)]
            out.append(P2PBatch(min(mine, default=a.t_begin_ns), a.t_end_ns, k.t_begin_ns, k.t_end_ns))
        previous_end = a.t_end_ns
    return out
