"""Builders of synthetic Kineto (torch.profiler) traces for tests (no torch needed).

Events are written as Kineto 2.x writes them: CPU events with the OS pid and tid, GPU events with the device
as pid and the stream as tid (and again in ``args``), ``ts``/``dur`` in microseconds with three decimals,
relative to ``baseTimeNanoseconds``.

    doc = KinetoDoc(backend="nccl")
    main = doc.thread(doc.pid, "python")                 # the main thread: tid == pid
    doc.cpu(main, "ProfilerStep#2", 10.0, 500.0, cat="user_annotation")
    doc.gpu(7, "Memcpy HtoD (Pageable -> Device)", 20.0, 3.5, cat="gpu_memcpy")
    doc.write(tmp_path / "rank0.json.gz")                # gzip by suffix

``training_doc()`` builds one rank of a job with every kind of event the reader sorts out; ``scene`` on the
result says what each event is meant to be, so tests derive their expectations from the inputs.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import orjson

# Kineto's base time is the start of a 7889238 s interval of the Unix epoch; ts are then ~10**12 us.
BASE_NS = 227 * 7_889_238 * 1_000_000_000
TS0 = 4_464_633_909_000.0  # a ts of today's magnitude: 51.7 days after BASE_NS


def us(value: float) -> float:
    """A ts or dur as Kineto writes it: microseconds with three decimals (nanoseconds)."""
    return round(value, 3)


@dataclass
class KinetoDoc:
    """One rank's trace, built event by event."""

    rank: int = 0
    world_size: int = 2
    backend: str = "nccl"
    pid: int = 4242
    device: int = 0
    base_ns: int = BASE_NS
    more_groups: list[dict] = field(default_factory=list)  # distributedInfo.pg_config past the default group
    events: list[Any] = field(default_factory=list)
    _correlation: int = 0

    def thread(self, tid: int, name: str) -> int:
        """Kineto's ``thread_name`` metadata (``"thread <tid> (<name>)"``); returns tid."""
        self.events.append({"ph": "M", "name": "thread_name", "ts": TS0, "pid": self.pid, "tid": tid,
                            "args": {"name": f"thread {tid} ({name})"}})
        return tid

    def cpu(self, tid: int, name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> dict:
        """A complete CPU event; ``args`` keys with spaces go through ``extra``."""
        event = {"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid, "ts": us(TS0 + ts),
                 "dur": us(dur), "args": {"External id": len(self.events), **args.pop("extra", {}), **args}}
        self.events.append(event)
        return event

    def gpu(self, stream: int, name: str, ts: float, dur: float, cat: str = "kernel", **args: Any) -> dict:
        """A complete GPU event on ``stream``, with the noise args Kineto adds to kernels."""
        self._correlation += 1
        event = {"ph": "X", "cat": cat, "name": name, "pid": self.device, "tid": stream, "ts": us(TS0 + ts),
                 "dur": us(dur), "args": {"External id": len(self.events), "device": self.device,
                                          "stream": stream, "correlation": self._correlation,
                                          "registers per thread": 32, "grid": [4, 1, 1],
                                          **args.pop("extra", {}), **args}}
        self.events.append(event)
        return event

    def raw(self, event: Any) -> Any:
        """Anything at all, as a list item of traceEvents (malformed events)."""
        self.events.append(event)
        return event

    def document(self) -> dict[str, Any]:
        return {
            "schemaVersion": 1, "deviceProperties": [],
            "distributedInfo": {"backend": self.backend, "rank": self.rank, "world_size": self.world_size,
                                "pg_count": 1, "pg_config": [{"pg_name": "0", "pg_desc": "default_pg",
                                                              "pg_size": self.world_size,
                                                              "ranks": list(range(self.world_size))},
                                                             *self.more_groups]},
            "displayTimeUnit": "ms", "baseTimeNanoseconds": self.base_ns, "traceEvents": self.events,
        }

    def write(self, path: Path) -> Path:
        """``.json.gz`` / ``.gz``: gzip (no timestamp, so bytes are reproducible); otherwise plain JSON."""
        raw = orjson.dumps(self.document())
        path.write_bytes(gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)
        return path

    def absolute_ns(self, ts: float | str) -> int:
        """The exact absolute time of a written ts, by decimal arithmetic (independent of the reader)."""
        return self.base_ns + int(Decimal(repr(ts) if isinstance(ts, float) else ts) * 1000)


@dataclass
class Scene:
    """What ``training_doc`` put where: raw events by role."""

    main: int
    autograd: int
    gloo_named: int  # a gloo worker Kineto names pt_gloo_runloop
    gloo_unnamed: int  # a gloo worker whose only name says "python": recognised by its events
    cpu_kept: list[dict] = field(default_factory=list)  # on training threads
    cpu_dropped: list[dict] = field(default_factory=list)  # on workers and tid 0
    gpu: list[tuple[dict, str]] = field(default_factory=list)  # (event, expected class)
    gpu_annotations: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # the ProfilerStep#n events
    garbage: list[Any] = field(default_factory=list)


# A second process group as distributedInfo.pg_config lists it: with it, a trace lists several
TP_GROUP = {"pg_name": "1", "pg_desc": "tp", "pg_size": 2, "ranks": [0, 1]}
COMPUTE, COMM, MEMORY = "compute", "comm", "memory"
COMPUTE_STREAM, NCCL_STREAM = 7, 13  # 7 < 13, but "stream 13" < "stream 7" as text: lanes sort as numbers


def training_doc(**kwargs: Any) -> tuple[KinetoDoc, Scene]:
    """Two profiler steps of one NCCL rank, with a gloo side group, written out of time order."""
    doc = KinetoDoc(**kwargs)
    sc = Scene(main=doc.thread(doc.pid, "python"), autograd=doc.thread(doc.pid + 8, "pt_autograd_0"),
               gloo_named=doc.thread(doc.pid + 16, "pt_gloo_runloop"),
               gloo_unnamed=doc.thread(doc.pid + 17, "python"))
    # The step's second half first, so the reader has to sort.
    for n, t0 in ((3, 1000.0), (2, 0.0)):
        step = doc.cpu(sc.main, f"ProfilerStep#{n}", t0, 900.25, cat="user_annotation")
        sc.steps.append(step)
        sc.cpu_kept += [
            step,
            doc.cpu(sc.main, "train.py(57): train_step", t0 + 1.0, 800.0, cat="python_function"),
            # Same begin as its parent, shorter: sorting puts the parent first.
            doc.cpu(sc.main, "aten::mm", t0 + 1.0, 50.001),
            # ts ending .011 here: a float whose int(ts * 1000) and round(ts * 1000) both miss a nanosecond.
            doc.cpu(sc.main, "cudaLaunchKernel", t0 + 10.011, 4.5, cat="cuda_runtime", correlation=n * 10),
            doc.cpu(sc.main, "record_param_comms", t0 + 100.0, 30.0,
                    extra={"Collective name": "allreduce", "Seq": n, "Process Group Name": "0",
                           "In msg nelems": 1024, "Group size": 2, "Process Group Ranks": "[0, 1]"}),
            doc.cpu(sc.main, "c10d::allreduce_", t0 + 99.0, 40.0),
            doc.cpu(sc.autograd, "autograd::engine::evaluate_function: MmBackward0", t0 + 200.0, 60.0),
        ]
        sc.cpu_dropped += [
            doc.cpu(sc.gloo_named, "gloo:all_reduce", t0 + 300.0, 20.0, cat="user_annotation"),
            doc.cpu(sc.gloo_unnamed, "gloo:broadcast", t0 + 330.0, 10.0, cat="user_annotation"),
        ]
        sc.gpu += [
            (doc.gpu(COMPUTE_STREAM, "Memcpy HtoD (Pageable -> Device)", t0 + 5.0, 3.5, cat="gpu_memcpy",
                     bytes=4096), MEMORY),
            (doc.gpu(COMPUTE_STREAM, "sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", t0 + 12.011,
                     40.125), COMPUTE),
            (doc.gpu(COMPUTE_STREAM, "Memset (Device)", t0 + 60.0, 1.0, cat="gpu_memset"), MEMORY),
            (doc.gpu(COMPUTE_STREAM, "void at::native::vectorized_elementwise_kernel<4, at::native::"
                     "FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, "
                     "std::array<char*, 1ul>)", t0 + 62.0, 2.0), COMPUTE),
            (doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, "
                     "ncclWork*)", t0 + 110.011, 80.0,
                     extra={"Collective name": "allreduce", "Seq": n, "Process Group Name": "0",
                            "In msg nelems": 1024, "Group size": 2}), COMM),
            (doc.gpu(NCCL_STREAM, "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, "
                     "ncclWork*)", t0 + 200.0, 9.0), COMM),
            (doc.gpu(NCCL_STREAM, "Memcpy DtoD (Device -> Device)", t0 + 215.0, 2.0, cat="gpu_memcpy"), MEMORY),
        ]
        sc.gpu_annotations.append(doc.gpu(COMPUTE_STREAM, f"ProfilerStep#{n}", t0 + 4.0, 880.0,
                                          cat="gpu_user_annotation"))
    # Kineto's Python tracer puts the stacks of Python threads it does not follow under tid 0.
    sc.cpu_dropped.append(doc.cpu(0, "threading.py(1002): _bootstrap", 0.5, 1900.0, cat="python_function"))
    # Kineto's own rows: the profiler span and instant markers, with pids that are not processes.
    doc.raw({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
             "tid": "PyTorch Profiler", "ts": TS0, "dur": 2000.0})
    doc.raw({"ph": "i", "s": "g", "name": "Record Window End", "pid": "", "tid": "", "ts": TS0 + 2000.0})
    doc.raw({"ph": "s", "id": 1, "pid": doc.pid, "tid": sc.main, "ts": TS0 + 1.0, "cat": "fwdbwd",
             "name": "fwdbwd"})
    sc.garbage += [
        doc.raw(42),
        doc.raw({"ph": "X", "cat": "cpu_op", "name": "aten::bad_ts", "pid": doc.pid, "tid": sc.main,
                 "ts": "soon", "dur": 1.0}),
        doc.raw({"ph": "X", "cat": "cpu_op", "name": "aten::no_dur", "pid": doc.pid, "tid": sc.main,
                 "ts": TS0}),
        doc.raw({"ph": "X", "cat": "cpu_op", "name": "aten::negative", "pid": doc.pid, "tid": sc.main,
                 "ts": TS0, "dur": -1.0}),
        doc.raw({"ph": "X", "cat": "cpu_op", "name": None, "pid": doc.pid, "tid": sc.main, "ts": TS0,
                 "dur": 1.0}),
        doc.raw({"ph": "X", "cat": "kernel", "name": "kernel_without_stream", "pid": "GPU", "tid": "x",
                 "ts": TS0, "dur": 1.0}),
    ]
    return doc, sc


@dataclass
class TraceJob:
    """What ``write_trace_job`` put in its traces, to derive expectations from."""

    paths: list[Path]
    offsets_ns: dict[int, int]  # rank -> how far that rank's clock is ahead of the true clock
    ends_ns: list[int]  # true end of each all-reduce (every rank's kernel ends then)
    late_rank: int  # the rank that issues every all-reduce last


def write_trace_job(folder: Path, world: int = 3, collectives: int = 6, seq: bool = True,
                    offsets_ns: dict[int, int] | None = None, late_rank: int = 1, start_ns: int | None = None,
                    name: str = "rank{rank}.pt.trace.json", steps: bool = True,
                    sample: list[int] | None = None, args: bool = True,
                    more_groups: list[dict] | None = None) -> TraceJob:
    """One NCCL trace per rank: ``collectives`` all-reduces on the default group, one per ``ProfilerStep#n``
    (n from 5), each a ``record_param_comms`` launching a kernel by ``cudaLaunchKernel``. Every rank's kernel
    of a collective ends at the same true time (NCCL finishes together); rank ``late_rank`` issues each one
    300 us after the others. Rank r's clock runs ``offsets_ns[r]`` ahead (default: r * 1.5 ms + 123 ns).
    ``start_ns``: the true time of the first step (default: TS0 after ``BASE_NS``). ``sample``: write only
    these ranks' traces (people profile a few ranks of a large job). ``args=False``: the events carry no
    collective args (torch of 2023: the kernel's name says the operation, nothing names its group).
    ``more_groups``: ``pg_config`` entries each trace lists past the default group's."""
    base_ns = BASE_NS if start_ns is None else start_ns - int(TS0) * 1000
    folder.mkdir(parents=True, exist_ok=True)
    offsets = offsets_ns if offsets_ns is not None else {r: r * 1_500_000 + 123 * bool(r) for r in range(world)}
    paths: list[Path] = []
    ends: list[int] = []
    for rank in range(world) if sample is None else sample:
        doc = KinetoDoc(rank=rank, world_size=world, base_ns=base_ns, more_groups=more_groups or [])
        main = doc.thread(doc.pid, "python")
        off_us = offsets[rank] / 1000
        for k in range(collectives):
            t0 = k * 1000.0 + off_us  # this rank's clock, us after TS0
            if steps:
                doc.cpu(main, f"ProfilerStep#{k + 5}", t0, 900.0, cat="user_annotation")
            doc.gpu(COMPUTE_STREAM, "sm90_xmma_gemm_bf16", t0 + 50.0, 200.0)
            issue = t0 + 100.0 + (300.0 if rank == late_rank else 0.0)
            comm = {"Collective name": "allreduce", "Process Group Name": "0", "Process Group Description":
                    "default_pg", "Process Group Ranks": str(list(range(world))), "In msg nelems": 1024,
                    "Out msg nelems": 1024, "dtype": "Float", "Group size": world}
            if seq:
                comm["Seq"] = k + 1
            if not args:
                comm = {}
            rpc = doc.cpu(main, "record_param_comms", issue, 20.0, extra=comm)
            launch = doc.cpu(main, "cudaLaunchKernel", issue + 5.0, 5.0, cat="cuda_runtime",
                             correlation=90_000 + k)
            begin = issue + 10.0
            end = t0 + 700.0  # the same true time on every rank
            doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", begin, end - begin,
                    extra={**comm, "External id": rpc["args"]["External id"],
                           "correlation": launch["args"]["correlation"]})
            if rank == 0:
                ends.append(doc.absolute_ns(us(TS0 + end)))
        paths.append(doc.write(folder / name.format(rank=rank)))
    return TraceJob(paths, offsets, ends, late_rank)
