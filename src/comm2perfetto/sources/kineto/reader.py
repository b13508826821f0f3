"""Reader for torch.profiler (Kineto) traces, ``.json`` or ``.json.gz``. Never imports torch.

Raw input (only the parts read here)::

    {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": 0, "world_size": 2,
                                             "pg_count": 1, "pg_config": [...]},
     "baseTimeNanoseconds": 1790857026000000000,
     "traceEvents": [
       {"ph": "M", "name": "thread_name", "pid": 5370, "tid": 5433,
        "args": {"name": "thread 5433 (pt_gloo_runloop)"}},
       {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 5370, "tid": 5370,
        "ts": 4464633909866.391, "dur": 3586.263, "args": {"External id": 1}},
       {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 5370, "tid": 5370,
        "ts": 4464633910918.742, "dur": 193.34, "args": {"External id": 159}},
       {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 5370, "tid": 5433,
        "ts": 4464633912244.753, "dur": 1140.501, "args": {"External id": 1025}},
       {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
        "ts": 4464633910950.0, "dur": 50.0, "args": {"device": 0, "stream": 20, "correlation": 77,
        "Collective name": "allreduce", "Seq": 5, "Process Group Name": "0", "In msg nelems": 4,
        "Group size": 2}}]}

Absolute time of an event = ``baseTimeNanoseconds + ts * 1000`` (``ts`` is in microseconds, written with three
decimals, i.e. to the nanosecond; traces from before ``baseTimeNanoseconds`` existed have absolute ``ts``).

What is kept, per trace (the raw dicts are dropped once read):

- ``comm_events``: every event whose name says communication (``c10d::allreduce_`` on the calling thread,
  ``gloo:all_reduce`` on gloo's worker thread, ``record_param_comms``, NCCL kernels), on any thread.
- ``cpu_ops``: CPU-side events (``cpu_op``, ``user_annotation``, ``python_function``, ``cuda_runtime`` ...) of
  the *training threads*: see ``is_training_thread`` for the rule.
- ``gpu_events``: kernels, memcpy and memset on GPU streams, each classified comm / memory / compute as
  Holistic Trace Analysis (HTA) does (``classify_gpu``); ``gpu_annotations``: the ``gpu_user_annotation``
  ranges Kineto projects onto streams (kept apart: they would otherwise count as kernels).
- ``steps``: ``(n, begin_ns, end_ns)`` of each ``ProfilerStep#n`` annotation on a training thread. Only
  profilers run with a ``schedule`` (which call ``prof.step()``) write them; a plain ``profile()`` window
  (``comm2perfetto record --profile-steps``) has none.

Events with a missing or malformed name, time or duration are skipped; only a file that cannot be read as a
Kineto trace at all raises ``KinetoFormatError``.
"""

from __future__ import annotations

import gc
import math
import re
import zlib
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from math import ceil, floor
from pathlib import Path
from types import MappingProxyType
from typing import Any

import orjson

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.sources.kineto.comm_kernels import ALL_COMM_KERNELS, HTA_COMM_KERNELS
from comm2perfetto.sources.limits import MAX_TIME_NS, MAX_TRACE_BYTES, TooLargeError, gunzip_bounded, read_bounded

_COMM_NAME = re.compile(r"^(nccl|gloo|c10d::|_?c10d_functional::|record_param_comms)|"
                        + ALL_COMM_KERNELS.pattern, re.IGNORECASE)

# GPU kernel classes: comm = the kernels of sources/kineto/comm_kernels.py's table (NCCL, RCCL, symmetric memory,
# NVSHMEM, oneCCL ...; with hta=True only the rows Holistic Trace Analysis counts), memory = Memcpy*/Memset*
# activities, all else on a stream is compute.
_GPU_MEMORY_NAME = re.compile(r"Memcpy|Memset")

# Kineto categories ("cat"), normalised: current names as libkineto's ActivityType.cpp spells them, plus the
# capitalised names of early Kineto releases ("Operator", "Kernel", "Runtime", "Memcpy", "Memset").
_KIND_ALIASES = {
    "operator": "cpu_op", "runtime": "cuda_runtime", "driver": "cuda_driver", "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
}
GPU_WORK_KINDS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
GPU_ANNOTATION_KIND = "gpu_user_annotation"
_CPU_KINDS = frozenset({"cpu_op", "user_annotation", "python_function", "hpu_op"})
_CPU_KIND_SUFFIXES = ("_runtime", "_driver")  # cuda_runtime, cuda_driver, xpu_runtime, privateuse1_driver ...

# Comm library worker threads that show up in a trace: gloo runs each collective on its own worker thread
# ("thread 5433 (pt_gloo_runloop)", seen on torch 2.13), NCCL's watchdog/heartbeat threads are pt_nccl_*.
_WORKER_THREAD_NAME = re.compile(r"gloo|nccl", re.IGNORECASE)
# What such a worker records: the backend's own annotation of the collective it runs ("gloo:all_reduce").
_BACKEND_ANNOTATION = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")
_PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")

# The args worth showing next to an event; the rest (occupancy, registers, Ev Idx ...) is dropped. Most
# events have none of them, so most keep no args at all: the ids that every event has are fields of their own,
# and a GPU event's device and stream are in its lane.
SHOWN_ARGS = (
    "Collective name", "Seq", "Process Group Name", "Process Group Description", "In msg nelems",
    "Out msg nelems", "Group size", "dtype", "bytes",
)
_SHOWN_ARG_SET = frozenset(SHOWN_ARGS)

ArgValue = str | int | float | bool
_NO_ARGS: Mapping[str, ArgValue] = MappingProxyType({})


class KinetoFormatError(Comm2PerfettoError, ValueError):
    """The file is not a readable Kineto trace."""


@dataclass(frozen=True, slots=True)
class KinetoCommEvent:
    """A communication event on any thread or stream (see ``_COMM_NAME``), with what its args say about the
    collective (recent torch writes them on ``record_param_comms`` and on the NCCL kernel; older traces have
    none): ``"Collective name": "allreduce"``, ``"Seq": 5``, ``"Process Group Name": "0"``,
    ``"Process Group Description": "default_pg"``, ``"Process Group Ranks": "[0, 1]"``, ``"In msg nelems"``,
    ``"Out msg nelems"``, ``"dtype": "Float"``. ``external_id`` (Kineto's ``External id``) ties a kernel to the
    CPU op that launched it."""

    name: str
    t_begin_ns: int
    duration_ns: int
    pid: Any
    tid: Any
    category: str
    collective: str | None
    seq: int | None
    pg_name: str | None
    pg_desc: str | None = None
    pg_ranks: str | None = None
    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None
    external_id: int | None = None

    @property
    def t_end_ns(self) -> int:
        return self.t_begin_ns + self.duration_ns

    @property
    def on_gpu(self) -> bool:
        return normalise_kind(self.category) in GPU_WORK_KINDS


@dataclass(frozen=True, slots=True)
class KinetoEvent:
    """One complete event of a training thread or a GPU stream.

    From ``{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 20,
    "ts": 20.0, "dur": 50.0, "args": {"device": 0, "stream": 20, "correlation": 77, "External id": 9,
    "Seq": 5, "grid": [2, 1, 1]}}`` with ``baseTimeNanoseconds`` B: ``KinetoEvent(
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL", B + 20_000, 50_000, "gpu 0 stream 20", "kernel", "comm",
    {"Seq": 5}, external_id=9, correlation=77)``.

    ``lane`` is a display key: ``"thread <tid>"`` for CPU events, ``"gpu <device> stream <stream>"`` for GPU
    ones (``KinetoTrace.lane_names`` has a label for each). ``klass`` is None for CPU events. ``args`` holds
    only the ``SHOWN_ARGS`` present; treat it as read-only. ``external_id`` links a CPU op to the kernels it
    launched (Kineto's ``External id``), ``correlation`` a ``cudaLaunchKernel`` to its kernel.
    """

    name: str
    t_begin_ns: int
    duration_ns: int
    lane: str
    kind: str
    klass: str | None = None
    args: Mapping[str, ArgValue] = field(default_factory=lambda: _NO_ARGS)
    external_id: int | None = None
    correlation: int | None = None

    @property
    def t_end_ns(self) -> int:
        return self.t_begin_ns + self.duration_ns


@dataclass(frozen=True, slots=True)
class KinetoTrace:
    """One rank's profiler trace. ``cpu_ops``, ``gpu_events`` and ``gpu_annotations`` are sorted by lane (CPU
    lanes by thread id, then GPU lanes by device and stream), then by begin time, the longer event first at
    equal begins so that an enclosing op comes before what it encloses."""

    path: Path
    rank: int | None
    world_size: int | None
    backend: str | None
    base_time_ns: int
    pg_config: Any
    comm_events: tuple[KinetoCommEvent, ...]
    event_count: int
    cpu_ops: tuple[KinetoEvent, ...] = ()
    gpu_events: tuple[KinetoEvent, ...] = ()
    gpu_annotations: tuple[KinetoEvent, ...] = ()
    steps: tuple[tuple[int, int, int], ...] = ()
    gpu_steps: tuple[tuple[int, int, int], ...] = ()  # the steps on the GPU's time: see gpu_step_spans
    pid: int | None = None  # the profiled process (the pid of most CPU events)
    lane_names: Mapping[str, str] = field(default_factory=dict)  # lane -> label, e.g. "thread 5370 (python)"
    skipped_threads: tuple[str, ...] = ()  # CPU lanes left out of cpu_ops: see is_training_thread


def sniff_kineto(head: bytes) -> bool:
    """True when the first bytes (decompressed) look like a Chrome/Kineto trace."""
    text = head[:65536]
    return text.lstrip().startswith(b"{") and (b'"traceEvents"' in text or b'"distributedInfo"' in text
                                               or b'"schemaVersion"' in text)


def gunzip_head(data: bytes, size: int = 65536) -> bytes:
    """The first ``size`` bytes of a gzip stream, without inflating the whole file."""
    try:
        return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, size)
    except zlib.error:
        return b""


def normalise_kind(category: str) -> str:
    """Kineto's ``cat`` in today's spelling: ``"Kernel"`` -> ``"kernel"``, ``"Memcpy"`` -> ``"gpu_memcpy"``,
    ``"Runtime"`` -> ``"cuda_runtime"``, ``"cpu_op"`` -> ``"cpu_op"``."""
    kind = category.strip().lower()
    return _KIND_ALIASES.get(kind, kind)


def classify_gpu(name: str, category: str, hta: bool = False) -> str:
    """``"comm"``, ``"memory"`` or ``"compute"`` for a GPU event (``hta``: HTA's communication kernels only).

    >>> classify_gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel")
    'comm'
    >>> classify_gpu("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy")
    'memory'
    >>> classify_gpu("void at::native::vectorized_elementwise_kernel<4, ...>", "kernel")
    'compute'
    """
    if normalise_kind(category) in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if (HTA_COMM_KERNELS if hta else ALL_COMM_KERNELS).search(name):
        return "comm"
    if _GPU_MEMORY_NAME.search(name):
        return "memory"
    return "compute"


def is_training_thread(pid: int, tid: int, *, has_steps: bool, names: Sequence[str],
                       only_backend_annotations: bool) -> bool:
    """Whether the CPU thread ``tid`` of process ``pid`` is a training thread, whose events go to ``cpu_ops``.

    - Never tid 0: not a thread at all. With ``with_stack=True`` the stacks of Python threads other than the
      profiled one come with tid 0 (seen on torch 2.13: comm2perfetto's own watchdog thread,
      ``threading.py(1002): _bootstrap`` ...); several threads would share that row, and their slices could
      not nest.
    - Always the process's main thread (tid == pid on Linux), where the Python training loop runs, and any
      thread with a ``ProfilerStep#n`` annotation (the thread that calls ``prof.step()``).
    - Any other thread too (autograd's device threads ``pt_autograd_<n>`` run the backward pass of GPU jobs; a
      pin-memory thread copies batches), unless it is a communication library's worker: a thread Kineto names
      after gloo or NCCL (``thread 5433 (pt_gloo_runloop)``), or one whose every event is a backend's own
      annotation (``gloo:all_reduce``). The second test is needed because Kineto may name a gloo worker
      ``(python)`` first and ``(pt_gloo_runloop)`` after it (seen), or not at all. Workers' collectives stay in
      ``comm_events``.

    >>> is_training_thread(5370, 5433, has_steps=False, names=["thread 5433 (pt_gloo_runloop)"],
    ...                    only_backend_annotations=True)
    False
    """
    if tid <= 0:
        return False
    if tid == pid or has_steps:
        return True
    worker = only_backend_annotations or any(_WORKER_THREAD_NAME.search(n) for n in names)
    return not worker


def read_kineto(path: str | Path, data: bytes | None = None) -> KinetoTrace:
    """Parse a Kineto trace (``data``: its bytes, when already read). Raises KinetoFormatError."""
    path = Path(path)
    # The cyclic GC would walk the millions of (acyclic) dicts being created, again and again as they
    # accumulate: switched off while reading, a trace of 1M events reads in 5.8 s instead of 8.7 s.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        return _read(path, data)
    finally:
        if gc_was_on:
            gc.enable()


def _read(path: Path, data: bytes | None) -> KinetoTrace:
    doc, info, base = _load(path, data)
    parser = _Parser(base)
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict):
            parser.feed(ev)
    rank, world = info.get("rank"), info.get("world_size")
    backend = info.get("backend")
    return parser.finish(
        path=path, rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None,
        backend=backend if isinstance(backend, str) else None, base_time_ns=base,
        pg_config=info.get("pg_config"), event_count=len(doc["traceEvents"]),
    )


def _text(path: Path, data: bytes | None) -> bytes:
    """The file's JSON text (``data``, when given, instead of reading it), gunzipped."""
    try:
        if data is None:
            return read_bounded(path, MAX_TRACE_BYTES)
        return gunzip_bounded(data, MAX_TRACE_BYTES) if data[:2] == b"\x1f\x8b" else data
    except TooLargeError as exc:
        raise KinetoFormatError(f"{path}: {exc}") from exc
    except (OSError, EOFError, zlib.error) as exc:
        raise KinetoFormatError(f"{path}: not a readable Kineto trace ({type(exc).__name__})") from exc


def _load(path: Path, data: bytes | None) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The parsed document, its ``distributedInfo`` ({} when absent) and ``baseTimeNanoseconds``."""
    return _parse(path, _text(path, data))


def _parse(path: Path, text: bytes) -> tuple[dict[str, Any], dict[str, Any], int]:
    """``_load`` of the JSON text ``_text`` returned."""
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise KinetoFormatError(f"{path}: not a readable Kineto trace ({type(exc).__name__})") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise KinetoFormatError(f"{path}: not a Kineto trace (no traceEvents)")
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    base = _int_or_none(doc.get("baseTimeNanoseconds")) or 0
    return doc, info, base if 0 <= base <= MAX_TIME_NS else 0


Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class KinetoSpans:
    """What the time accounting of ``report`` needs from a trace: begin/end pairs, no events.

    ``gpu`` maps a class (``compute``, ``comm``, ``memory``: see ``classify_gpu``) to the spans of that class's
    kernels, memcpys and memsets; ``cpu_compute`` holds the CPU ops and user annotations of training threads that
    are neither communication nor ``ProfilerStep#n``; ``comm`` every communication event (``_COMM_NAME``) on
    any thread or stream. Reading spans is 3x faster than ``read_kineto``, which builds an object per event.
    ``cpu_read``: False when the trace has compute or communication kernels and the CPU side was skipped
    (``cpu_compute`` and ``comm`` empty): report's figures then come from the kernels alone.
    """

    path: Path
    gpu: Mapping[str, list[Span]]
    cpu_compute: list[Span]
    comm: list[Span]
    steps: tuple[tuple[int, int, int], ...]
    event_count: int
    cpu_read: bool = True
    gpu_steps: tuple[tuple[int, int, int], ...] = ()  # see gpu_step_spans
    collectives: KinetoTrace | None = None  # with collectives=True: the trace's comm events only (see below)


def read_kineto_spans(path: str | Path, data: bytes | None = None, whole_us: bool = False,
                      cpu: bool = False, hta_scope: bool = False, collectives: bool = False) -> KinetoSpans:
    """Parse a Kineto trace into spans (see ``KinetoSpans``). Raises KinetoFormatError.

    ``whole_us``: round each event inward to whole microseconds first (begin up, end down), as HTA does by
    default since Kineto writes nanoseconds (``HTA_DISABLE_NS_ROUNDING`` turns it off there). A kernel from
    ts 10.3 to 12.7 us becomes 11 to 12 us, one that never covers a whole microsecond disappears. Every kernel
    loses about a microsecond, so HTA's overlap is lower than the exact one (by half a point on traces of
    ~100 us kernels); with it the figures are HTA's to the digit.

    The CPU side (``cpu_compute``, ``comm``) is read only when the trace turns out to have no compute or
    communication kernels, or with ``cpu=True``: the CPU ops of a GPU trace would be read for nothing, and
    skipping them halves the walk over the events. Whether to try that is guessed from the text (``"kernel"``
    in it: Kineto's category of kernels); a wrong guess costs a second walk, never a wrong answer.

    ``hta_scope``: the GPU spans Holistic Trace Analysis's ``get_comm_comp_overlap`` looks at by default
    (``TraceAnalysis(include_last_profiler_step=False)``, ``Trace._filter_irrelevant_gpu_kernels`` in HTA 0.5.0):
    with two steps or more, only kernels whose launch (the runtime call of the same correlation id) began
    before the latest begin of a ``ProfilerStep#n`` event; HTA takes that latest begin over every event but
    kernels, so the ``gpu_user_annotation`` copies Kineto projects onto streams count too. Classified with HTA's
    communication kernels only (``classify_gpu(hta=True)``).

    ``collectives``: also keep the trace's communication events, exactly timed, as a ``KinetoTrace`` holding
    ``comm_events`` only (what ``sources.kineto.collectives`` needs): NCCL kernels and ``record_param_comms``.
    """
    path = Path(path)
    gc_was_on = gc.isenabled()
    gc.disable()  # as in read_kineto
    try:
        raw = _text(path, data)
        kernels_first = not cpu and b'"kernel"' in raw
        doc, info, base = _parse(path, raw)
        del raw  # before the walk: the text is as large as the events' strings
        events = doc["traceEvents"]
        parser = _SpanParser(base, whole_us, hta_scope)
        parser.feed_all(events, cpu=not kernels_first, collect=collectives)
        if kernels_first and not (parser.gpu_spans["compute"] or parser.gpu_spans["comm"]):
            parser = _SpanParser(base, whole_us, hta_scope)  # no kernels: the figures come from the CPU side
            parser.feed_all(events, collect=collectives)
        spans = parser.spans(path, len(events))
        if not collectives:
            return spans
        comm = _Parser(base)  # exact times, whatever rounding the spans had
        comm.feed_comm(parser.comm_raw)
        world = info.get("world_size")
        light = KinetoTrace(path=path, rank=None, world_size=world if isinstance(world, int) else None,
                            backend=None, base_time_ns=base, pg_config=None, comm_events=tuple(comm.comm),
                            event_count=len(events))
        return replace(spans, collectives=light)
    finally:
        if gc_was_on:
            gc.enable()


# --- parsing ----------------------------------------------------------------------------------------------


def us_to_ns(value: Any) -> int | None:
    """Kineto microseconds -> integer nanoseconds, rounded; None for anything but a finite number.

    ``ts`` is written to the nanosecond (three decimals) but parsed as a float, within half an ulp of the
    decimal. Around today's ts (~2**42 us) ``int(ts * 1000)`` is a nanosecond short for about 1 value in 170, and
    ``round(ts * 1000)`` off for 1 in 340 (the product's own rounding adds to the float's error; e.g.
    ``4453700846418.643``). Splitting off the whole microseconds first (an exact subtraction) and rounding only
    the fraction gives back the written nanoseconds for every ts < 2**43 us (101.8 days). Kineto's base time is
    the start of the 7889238-second (91.3-day) interval the process started in (libkineto ChromeTraceBaseTime),
    so ts stays below that unless the trace is taken over ten days after that interval ended; past 2**43 us the
    float itself has 2 ns steps.

    >>> us_to_ns(4464633909866.391), us_to_ns(12), us_to_ns("x")
    (4464633909866391, 12000, None)
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        whole = math.floor(value)  # an int
        ns = whole * 1000 + round((value - whole) * 1000)
    elif isinstance(value, int) and not isinstance(value, bool):
        ns = value * 1000
    else:
        return None
    return ns if -MAX_TIME_NS <= ns <= MAX_TIME_NS else None  # 1e100 is a number, not a time


def _int_or_none(value: Any) -> int | None:
    """An int field that may be written as a number or a digit string (``"Seq": "5"``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class _Thread:
    """What the parser gathers about one CPU thread: its KinetoEvents (the span parser: its compute spans)."""

    __slots__ = ("events", "has_steps", "lane", "only_backend")

    def __init__(self, tid: int) -> None:
        self.lane = f"thread {tid}"
        self.events: list[Any] = []
        self.only_backend = True  # every event so far is a backend annotation ("gloo:all_reduce")
        self.has_steps = False


# What a category means to the parser: skipped, a CPU event, GPU work, or a GPU annotation (_LAUNCH: a
# runtime/driver call, to the span parser).
_SKIP, _CPU, _GPU, _GPU_ANNOTATION, _LAUNCH = range(5)


class _Parser:
    """One pass over ``traceEvents``; keeps compact events, never the raw dicts.

    A trace has millions of events but a few thousand distinct names and a handful of categories and threads,
    so everything decided per name, category or thread is decided once and cached.
    """

    def __init__(self, base_ns: int) -> None:
        self.base = base_ns
        self.comm: list[KinetoCommEvent] = []
        self.threads: dict[tuple[int, int], _Thread] = {}
        self.thread_names: dict[tuple[int, int], list[str]] = {}
        self.gpu: list[KinetoEvent] = []
        self.gpu_ann: list[KinetoEvent] = []
        self.gpu_lanes: dict[tuple[int, int], str] = {}
        # name -> (the one copy kept, is communication, is a backend annotation, ProfilerStep number)
        self._names: dict[str, tuple[str, bool, bool, int | None]] = {}
        self._kinds: dict[str, tuple[str, int]] = {}  # category -> (kind, _SKIP/_CPU/_GPU/_GPU_ANNOTATION)
        self._klasses: dict[tuple[str, str], str] = {}  # (kernel name, category) -> classify_gpu
        self._strings: dict[str, str] = {}

    def _intern(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def _name(self, name: str) -> tuple[str, bool, bool, int | None]:
        info = self._names.get(name)
        if info is None:
            step = _PROFILER_STEP.match(name)
            info = (name, bool(_COMM_NAME.search(name)), bool(_BACKEND_ANNOTATION.match(name)),
                    int(step.group(1)) if step else None)
            self._names[name] = info
        return info

    def _kind(self, category: str) -> tuple[str, int]:
        known = self._kinds.get(category)
        if known is None:
            kind = normalise_kind(category)
            if kind in GPU_WORK_KINDS:
                role = _GPU
            elif kind == GPU_ANNOTATION_KIND:
                role = _GPU_ANNOTATION
            elif kind in _CPU_KINDS or kind.endswith(_CPU_KIND_SUFFIXES):
                role = _CPU
            else:
                role = _SKIP
            known = self._kinds[category] = (kind, role)
        return known

    def feed(self, ev: dict[str, Any]) -> None:
        """Take one raw event. The hot loop of the reader: lookups are cached, and the common case (float
        ts/dur, int pid/tid/ids) is tested by type before anything slower runs."""
        get = ev.get
        ph = get("ph")
        if ph != "X":
            if ph == "M":
                self._metadata(ev)
            return
        name, ts, dur = get("name"), get("ts"), get("dur")
        if not isinstance(name, str):
            return
        span = _span(ts, dur, self.base)
        if span is None:
            return
        begin, duration = span[0], span[1] - span[0]
        args = get("args")
        if args.__class__ is not dict:
            args = {}
        category = get("cat")
        if category.__class__ is not str:
            category = ""
        name, is_comm, is_backend, step = self._names.get(name) or self._name(name)
        if is_comm:
            self._comm(ev, name, begin, duration, category, args)
        kind, role = self._kinds.get(category) or self._kind(category)
        if role == _SKIP:
            return
        shown = _NO_ARGS if _SHOWN_ARG_SET.isdisjoint(args) else self._args(args)
        external, correlation = args.get("External id"), args.get("correlation")
        if external is not None and external.__class__ is not int:
            external = _int_or_none(external)
        if correlation is not None and correlation.__class__ is not int:
            correlation = _int_or_none(correlation)
        if role == _CPU:
            pid, tid = get("pid"), get("tid")
            if pid.__class__ is not int or tid.__class__ is not int:
                pid, tid = _int_or_none(pid), _int_or_none(tid)
                if pid is None or tid is None:  # Kineto's own rows ("Spans", "Traces") are not threads
                    return
            thread = self.threads.get((pid, tid)) or self._thread(pid, tid)
            thread.events.append(KinetoEvent(name, begin, duration, thread.lane, kind, None, shown, external,
                                             correlation))
            if not is_backend:
                thread.only_backend = False
            if step is not None:
                thread.has_steps = True
            return
        # A GPU event: Kineto writes the device as pid and the stream as tid, and both again in args.
        device, stream = args.get("device"), args.get("stream")
        if device.__class__ is not int:
            device = _int_or_none(device)
            if device is None:
                device = _int_or_none(get("pid"))
        if stream.__class__ is not int:
            stream = _int_or_none(stream)
            if stream is None:
                stream = _stream_from_tid(get("tid"))
        if device is None or stream is None:
            return
        lane = self.gpu_lanes.get((device, stream)) or self._gpu_lane(device, stream)
        if role == _GPU_ANNOTATION:
            self.gpu_ann.append(KinetoEvent(name, begin, duration, lane, kind, None, shown, external, correlation))
        else:
            klass = self._klasses.get((name, category)) or self._klass(name, category)
            self.gpu.append(KinetoEvent(name, begin, duration, lane, kind, klass, shown, external, correlation))

    def _thread(self, pid: int, tid: int) -> _Thread:
        thread = self.threads[(pid, tid)] = _Thread(tid)
        return thread

    def feed_comm(self, events: list[Any]) -> None:
        """Take only the communication events (``comm``) of every raw event: names decided once each."""
        names, name_of, base = self._names, self._name, self.base
        for ev in events:
            if ev.__class__ is not dict:
                continue
            get = ev.get
            name = get("name")
            if name.__class__ is not str or get("ph") != "X":
                continue
            info = names.get(name) or name_of(name)
            if not info[1]:
                continue
            span = _span(get("ts"), get("dur"), base)
            if span is None:
                continue
            args, category = get("args"), get("cat")
            self._comm(ev, info[0], span[0], span[1] - span[0], category if category.__class__ is str else "",
                       args if args.__class__ is dict else {})

    def _gpu_lane(self, device: int, stream: int) -> str:
        lane = self.gpu_lanes[(device, stream)] = f"gpu {device} stream {stream}"
        return lane

    def _klass(self, name: str, category: str) -> str:
        klass = self._klasses[(name, category)] = classify_gpu(name, category)
        return klass

    def _comm(self, ev: dict[str, Any], name: str, begin: int, dur: int, category: str,
              args: dict[str, Any]) -> None:
        get = args.get
        collective, pg_name, desc, ranks, dtype = (get("Collective name"), get("Process Group Name"),
                                                   get("Process Group Description"), get("Process Group Ranks"),
                                                   get("dtype"))
        self.comm.append(KinetoCommEvent(
            name=name, t_begin_ns=begin, duration_ns=dur, pid=ev.get("pid"), tid=ev.get("tid"),
            category=self._intern(category),
            collective=self._intern(collective) if isinstance(collective, str) else None,
            seq=_int_or_none(get("Seq")), pg_name=self._intern(str(pg_name)) if pg_name is not None else None,
            pg_desc=self._intern(desc) if isinstance(desc, str) else None,
            pg_ranks=self._intern(ranks) if isinstance(ranks, str) else None,
            in_nelems=_int_or_none(get("In msg nelems")), out_nelems=_int_or_none(get("Out msg nelems")),
            dtype=self._intern(dtype) if isinstance(dtype, str) else None,
            external_id=_int_or_none(get("External id")),
        ))

    def _args(self, args: dict[str, Any]) -> Mapping[str, ArgValue]:
        """The ``SHOWN_ARGS`` of an event that has some (most have none: ``feed`` checks that first)."""
        kept: dict[str, ArgValue] = {}
        for key in SHOWN_ARGS:
            value = args.get(key)
            if isinstance(value, str):
                kept[key] = self._intern(value)
            elif isinstance(value, (int, float)):  # bool too: it is an int
                kept[key] = value
        return kept if kept else _NO_ARGS

    def _metadata(self, ev: dict[str, Any]) -> None:
        if ev.get("name") != "thread_name":
            return
        pid, tid = _int_or_none(ev.get("pid")), _int_or_none(ev.get("tid"))
        args = ev.get("args")
        label = args.get("name") if isinstance(args, dict) else None
        if pid is not None and tid is not None and isinstance(label, str):
            self.thread_names.setdefault((pid, tid), []).append(label)

    def finish(self, **fields: Any) -> KinetoTrace:
        lane_order: dict[str, tuple[int, int, int]] = {}
        lane_names: dict[str, str] = {}
        cpu_ops: list[KinetoEvent] = []
        skipped: list[str] = []
        for (pid, tid), thread in sorted(self.threads.items()):
            names = self.thread_names.get((pid, tid), [])
            if not is_training_thread(pid, tid, has_steps=thread.has_steps, names=names,
                                      only_backend_annotations=thread.only_backend):
                skipped.append(thread.lane)
                continue
            lane_order[thread.lane] = (0, tid, 0)
            lane_names[thread.lane] = names[-1] if names else thread.lane  # Kineto's latest name comes last
            cpu_ops.extend(thread.events)
        for (device, stream), lane in self.gpu_lanes.items():
            lane_order[lane] = (1, device, stream)
            lane_names[lane] = f"GPU {device} stream {stream}"

        def order(ev: KinetoEvent) -> tuple[tuple[int, int, int], int, int]:
            return lane_order[ev.lane], ev.t_begin_ns, -ev.duration_ns

        cpu_ops.sort(key=order)
        self.gpu.sort(key=order)
        self.gpu_ann.sort(key=order)
        pids: Counter[int] = Counter()
        for (pid, _tid), thread in self.threads.items():
            pids[pid] += len(thread.events)
        steps = self._steps(cpu_ops)
        launches = {ev.correlation: ev.t_begin_ns for ev in cpu_ops
                    if ev.correlation is not None and ev.kind.endswith(_CPU_KIND_SUFFIXES)}
        launched = launch_steps(steps, launches, ((ev.correlation, ev.t_begin_ns) for ev in self.gpu))
        return KinetoTrace(
            comm_events=tuple(self.comm), cpu_ops=tuple(cpu_ops), gpu_events=tuple(self.gpu),
            gpu_annotations=tuple(self.gpu_ann), steps=steps,
            gpu_steps=gpu_step_spans(steps, launched, ((ev.t_begin_ns, ev.t_end_ns) for ev in self.gpu)),
            pid=pids.most_common(1)[0][0] if pids else None, lane_names=lane_names,
            skipped_threads=tuple(skipped), **fields,
        )

    @staticmethod
    def _steps(cpu_ops: list[KinetoEvent]) -> tuple[tuple[int, int, int], ...]:
        """``ProfilerStep#n`` spans; the same n on two threads (unusual) spans both."""
        spans: dict[int, tuple[int, int]] = {}
        for ev in cpu_ops:
            match = _PROFILER_STEP.match(ev.name) if ev.name.startswith("ProfilerStep#") else None
            if match:
                n = int(match.group(1))
                begin, end = spans.get(n, (ev.t_begin_ns, ev.t_end_ns))
                spans[n] = (min(begin, ev.t_begin_ns), max(end, ev.t_end_ns))
        return tuple((n, begin, end) for n, (begin, end) in sorted(spans.items()))


class _SpanParser(_Parser):
    """``_Parser``'s decisions (categories, names, threads, kernel classes) keeping only begin/end pairs."""

    def __init__(self, base_ns: int, whole_us: bool = False, hta_scope: bool = False) -> None:
        super().__init__(base_ns)
        self.hta = hta_scope
        self._span = _span_whole_us if whole_us else _span
        self.launch_events: list[dict[str, Any]] = []  # runtime/driver calls (launches), raw
        self.comm_raw: list[dict[str, Any]] = []  # communication events, raw (feed_all's collect)
        self.last_step_begin = -1  # the latest begin of a ProfilerStep#n event (CPU, or projected on a stream)
        self.kernels: list[tuple[dict[str, Any], Span, list[Span]]] = []  # (raw event, span, its class's list)
        self.gpu_spans: dict[str, list[Span]] = {"compute": [], "comm": [], "memory": []}
        self.comm_spans: list[Span] = []
        self.step_spans: dict[int, Span] = {}
        self.cpu_read = True
        # (name, category) -> what to do with such an event: everything ``feed`` decides from the two strings.
        self._plans: dict[tuple[str, str], tuple[int, list[Span] | None, list[Span] | None, bool, bool,
                                                 int | None]] = {}

    def _plan(self, name: str, category: str) -> tuple[int, list[Span] | None, list[Span] | None, bool, bool,
                                                       int | None]:
        """(role, GPU class list or None, comm list or None, is a backend annotation, CPU span wanted, step).
        A runtime call (a launch) is not wanted as a span: its role is _LAUNCH."""
        _name, is_comm, is_backend, step = self._name(name)
        kind, role = self._kind(category)
        gpu = self.gpu_spans[classify_gpu(name, category, self.hta)] if role == _GPU else None
        wanted = step is not None or is_comm or kind in _COMPUTE_KINDS  # runtime calls are neither
        if role == _CPU and kind.endswith(_CPU_KIND_SUFFIXES):
            role = _LAUNCH
        plan = self._plans[(name, category)] = (role, gpu, self.comm_spans if is_comm else None, is_backend,
                                                wanted, step)
        return plan

    def _launches(self) -> dict[Any, int]:
        """correlation id -> begin (ns) of the runtime call that launched it."""
        out: dict[Any, int] = {}
        base = self.base
        for ev in self.launch_events:
            args, ts = ev.get("args"), ev.get("ts")
            if args.__class__ is dict and (ts.__class__ is float or ts.__class__ is int):
                correlation = args.get("correlation")
                if correlation is not None:
                    out[correlation] = base + round(ts * 1000)  # to the ns or so: only compared with steps
        return out

    def feed_all(self, events: list[Any], cpu: bool = True, collect: bool = False) -> None:
        """Take every raw event. One loop in one frame, everything it touches in a local: the per-event work is
        a handful of dict reads, and a method call per event would add a fifth to it. ``cpu=False``: keep GPU
        work and steps only. ``collect``: also keep the raw communication events (``comm_raw``). Kernels and
        launches are kept as raw events too: which step launched what is worked out at the end, only for
        traces that have steps."""
        self.cpu_read = cpu
        plans, plan_of = self._plans, self._plan
        threads, new_thread = self.threads, self._thread
        step_spans, base, _span = self.step_spans, self.base, self._span
        launches, kernels, comm_raw = self.launch_events, self.kernels, self.comm_raw
        for ev in events:
            if ev.__class__ is not dict:
                continue
            get = ev.get
            ph = get("ph")
            if ph != "X":
                if ph == "M":
                    self._metadata(ev)
                continue
            name, category = get("name"), get("cat")
            if name.__class__ is not str:
                continue
            if category.__class__ is not str:
                category = ""
            role, gpu, comm, is_backend, wanted, step = plans.get((name, category)) or plan_of(name, category)
            if role == _GPU:
                span = _span(get("ts"), get("dur"), base)
                if span is None or not _on_stream(ev):  # as read_kineto (and HTA): GPU work is on a device's stream
                    continue
                gpu.append(span)
                kernels.append((ev, span, gpu))
                if comm is not None:
                    if cpu:
                        comm.append(span)
                    if collect:
                        comm_raw.append(ev)
            elif role == _LAUNCH:
                launches.append(ev)
                if cpu:  # it is still a thread's event: the thread is not only a backend's worker
                    pid, tid = get("pid"), get("tid")
                    thread = threads.get((pid, tid)) if pid.__class__ is int and tid.__class__ is int else None
                    if thread is not None:
                        thread.only_backend = False
            elif role == _CPU:
                if comm is not None and collect:
                    comm_raw.append(ev)
                if step is None and not cpu:
                    continue
                pid, tid = get("pid"), get("tid")
                if pid.__class__ is not int or tid.__class__ is not int:
                    pid, tid = _int_or_none(pid), _int_or_none(tid)
                    if pid is None or tid is None:
                        continue
                thread = threads.get((pid, tid)) or new_thread(pid, tid)
                if not is_backend:
                    thread.only_backend = False
                if not wanted:
                    continue
                span = _span(get("ts"), get("dur"), base)
                if span is None:
                    continue
                if comm is not None:
                    comm.append(span)
                elif step is not None:
                    thread.has_steps = True
                    if span[0] > self.last_step_begin:
                        self.last_step_begin = span[0]
                    begin, end = step_spans.get(step, span)
                    step_spans[step] = (min(begin, span[0]), max(end, span[1]))
                else:
                    thread.events.append(span)
            elif comm is not None and cpu:
                span = _span(get("ts"), get("dur"), base)
                if span is not None:
                    comm.append(span)
            elif step is not None and role == _GPU_ANNOTATION:  # ProfilerStep#n projected onto a stream
                span = _span(get("ts"), get("dur"), base)
                if span is not None and span[0] > self.last_step_begin:
                    self.last_step_begin = span[0]

    def spans(self, path: Path, event_count: int) -> KinetoSpans:
        cpu: list[Span] = []
        for (pid, tid), thread in self.threads.items():
            if is_training_thread(pid, tid, has_steps=thread.has_steps, names=self.thread_names.get((pid, tid), []),
                                  only_backend_annotations=thread.only_backend):
                cpu.extend(thread.events)
        steps = tuple((n, b, e) for n, (b, e) in sorted(self.step_spans.items()))
        gpu = self.gpu_spans
        gpu_steps = steps
        if steps:
            launches = self._launches()
            correlations = [ev["args"].get("correlation") if ev.get("args").__class__ is dict else None
                            for ev, _, _ in self.kernels]
            launched = launch_steps(steps, launches, zip(correlations, (b for _, (b, _e), _ in self.kernels)))
            gpu_steps = gpu_step_spans(steps, launched, (span for _, span, _ in self.kernels))
            if self.hta and len(steps) > 1:  # HTA's scope (with a single step HTA keeps every kernel)
                gpu = {klass: [] for klass in gpu}
                by_list = {id(spans): klass for klass, spans in self.gpu_spans.items()}
                cut = self.last_step_begin
                for correlation, (_, span, spans) in zip(correlations, self.kernels):
                    launch = launches.get(correlation)
                    if launch is not None and launch < cut:
                        gpu[by_list[id(spans)]].append(span)
        return KinetoSpans(path, gpu, cpu, self.comm_spans, steps, event_count, self.cpu_read, gpu_steps)


_COMPUTE_KINDS = frozenset({"cpu_op", "user_annotation"})  # not python_function (wraps everything), not runtime


def launch_steps(steps: Sequence[tuple[int, int, int]], launches: Mapping[Any, int],
                 kernels: Iterable[tuple[Any, int]]) -> list[int | None]:
    """The step each GPU kernel belongs to: the ``ProfilerStep#n`` whose CPU span holds the runtime call that
    launched it (matched by correlation id), or, without a known launch, the step its own begin falls in.
    ``kernels``: (correlation, begin) pairs; None for a kernel launched outside every step.

    >>> launch_steps([(5, 0, 100), (6, 100, 200)], {7: 90}, [(7, 150), (None, 120), (8, 500)])
    [5, 6, None]
    """
    # a kernel per microsecond or so: one pass at C speed (map) for the times and the bisection
    times = [launches.get(c, b) if c is not None else b for c, b in kernels]
    slots = list(map(partial(bisect_right, [b for _, b, _ in steps]), times))
    numbers = [None] + [n for n, _, _ in steps]
    ends = [-1] + [e for _, _, e in steps]
    return [numbers[i] if t < ends[i] else None for i, t in zip(slots, times)]


def gpu_step_spans(steps: Sequence[tuple[int, int, int]], launched: Sequence[int | None],
                   kernels: Iterable[Span]) -> tuple[tuple[int, int, int], ...]:
    """Steps on the GPU's time: step n runs from the first begin of the kernels launched in it to the first
    begin of the next step's (the last one: to its kernels' last end). A step that launched nothing keeps
    its CPU span. Consecutive and disjoint, so that a range of steps is one window holding what they ran.

    >>> gpu_step_spans([(5, 0, 100), (6, 100, 200)], [5, 5, 6], [(40, 150), (150, 170), (180, 260)])
    ((5, 40, 180), (6, 180, 260))
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for n, (begin, end) in zip(launched, kernels):
        if n is not None:
            if begin < first.get(n, begin + 1):
                first[n] = begin
            if end > last.get(n, end - 1):
                last[n] = end
    if not first:
        return tuple(steps)
    out: list[tuple[int, int, int]] = []
    for k, (n, cpu_begin, cpu_end) in enumerate(steps):
        begin = first.get(n, cpu_begin)
        if out:
            begin = max(begin, out[-1][1])
        following = [first.get(m, b) for m, b, _ in steps[k + 1:k + 2]]
        end = max(following[0], begin) if following else max(last.get(n, cpu_end), cpu_end, begin)
        out.append((n, begin, end))
    return tuple(out)


def _on_stream(ev: dict[str, Any]) -> bool:
    """Whether a GPU event names its device and stream (in args, or as Kineto's pid and tid)."""
    args = ev.get("args")
    if args.__class__ is not dict:
        args = {}
    device, stream = args.get("device"), args.get("stream")
    if device.__class__ is int and stream.__class__ is int:  # what Kineto writes
        return True
    if device.__class__ is not int and _int_or_none(device) is None and _int_or_none(ev.get("pid")) is None:
        return False
    return stream.__class__ is int or _int_or_none(stream) is not None or _stream_from_tid(ev.get("tid")) is not None


def _span(ts: Any, dur: Any, base: int) -> Span | None:
    """(begin, end) in ns from Kineto's microsecond ts and dur; None when either is not a finite number or dur
    is negative (floor() refuses None, strings, NaN and infinities)."""
    try:
        whole = floor(ts)
        begin = base + whole * 1000 + round((ts - whole) * 1000)
        whole = floor(dur)
        duration = whole * 1000 + round((dur - whole) * 1000)
    except (TypeError, ValueError, OverflowError):
        return None
    return (begin, begin + duration) if 0 <= duration and 0 <= begin and begin + duration <= MAX_TIME_NS else None


def _span_whole_us(ts: Any, dur: Any, base: int) -> Span | None:
    """``_span`` rounded inward to whole microseconds as HTA rounds (``ceil(ts)``, ``floor(ts + dur)``, on the
    floats as written); None also when nothing is left."""
    try:
        begin, end = ceil(ts), floor(ts + dur)
    except (TypeError, ValueError, OverflowError):
        return None
    span = (base + begin * 1000, base + end * 1000)
    return span if end >= begin and dur >= 0 and 0 <= span[0] and span[1] <= MAX_TIME_NS else None


def _stream_from_tid(tid: Any) -> int | None:
    """Kineto writes a GPU event's stream as its tid: ``7``, or ``"stream 7"`` in some versions."""
    value = _int_or_none(tid)
    if value is not None:
        return value
    if isinstance(tid, str):
        match = re.search(r"\d+", tid)
        if match:
            return int(match.group(0))
    return None
