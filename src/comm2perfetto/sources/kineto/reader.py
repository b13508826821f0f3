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
  the *training threads*: see ``classify.is_training_thread`` for the rule.
- ``gpu_events``: kernels, memcpy and memset on GPU streams, each classified comm / memory / compute as
  Holistic Trace Analysis (HTA) does (``classify.classify_gpu``); ``gpu_annotations``: the
  ``gpu_user_annotation`` ranges Kineto projects onto streams (kept apart: they would otherwise count as
  kernels).
- ``steps``: ``(n, begin_ns, end_ns)`` of each ``ProfilerStep#n`` annotation on a training thread. Only
  profilers run with a ``schedule`` (which call ``prof.step()``) write them; a plain ``profile()`` window
  (``comm2perfetto record --profile-steps``) has none (``steps.profiler_steps``).

Events with a missing or malformed name, time or duration are skipped; only a file that cannot be read as a
Kineto trace at all raises ``KinetoFormatError``.
"""

from __future__ import annotations

import gc
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from comm2perfetto.errors import Comm2PerfettoError
from comm2perfetto.sources.kineto.events import KinetoSpans, KinetoTrace
from comm2perfetto.sources.kineto.fields import int_or_none
from comm2perfetto.sources.kineto.parse import EventParser
from comm2perfetto.sources.kineto.spans import SpanParser
from comm2perfetto.sources.limits import MAX_TIME_NS, MAX_TRACE_BYTES, TooLargeError, gunzip_bounded, read_bounded

__all__ = ["KinetoFormatError", "gunzip_head", "read_kineto", "read_kineto_and_spans", "read_kineto_spans",
           "sniff_kineto"]


class KinetoFormatError(Comm2PerfettoError, ValueError):
    """The file is not a readable Kineto trace."""


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


def read_kineto(path: str | Path, data: bytes | None = None) -> KinetoTrace:
    """Parse a Kineto trace (``data``: its bytes, when already read). Raises KinetoFormatError."""
    path = Path(path)
    # The cyclic GC would walk the millions of (acyclic) dicts being created, again and again as they
    # accumulate: switched off while reading, a trace of 1M events reads in 5.8 s instead of 8.7 s.
    gc_was_on = gc.isenabled()
    gc.disable()
    try:
        doc, info, base = _load(path, data)
        return _events(path, doc, info, base)
    finally:
        if gc_was_on:
            gc.enable()


def read_kineto_and_spans(path: str | Path) -> tuple[KinetoTrace, KinetoSpans]:
    """``read_kineto`` and ``read_kineto_spans`` (as it reads by default) of one reading: the file is read and its
    JSON parsed once, then each parser walks the events (merge --preview draws what report measures)."""
    path = Path(path)
    gc_was_on = gc.isenabled()
    gc.disable()  # as in read_kineto
    try:
        raw = _text(path, None)
        kernels_first = b'"kernel"' in raw
        doc, info, base = _parse(path, raw)
        del raw
        trace = _events(path, doc, info, base)
        events = doc["traceEvents"]
        return trace, _span_parser(events, base, kernels_first).spans(path, len(events))
    finally:
        if gc_was_on:
            gc.enable()


def _events(path: Path, doc: dict[str, Any], info: dict[str, Any], base: int) -> KinetoTrace:
    parser = EventParser(base)
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
    info = doc.get("distributedInfo")
    if not isinstance(info, dict):
        info = {}
    base = int_or_none(doc.get("baseTimeNanoseconds")) or 0
    return doc, info, base if 0 <= base <= MAX_TIME_NS else 0


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
    ``comm_events`` and ``pg_config`` only (what ``sources.kineto.collectives`` needs): NCCL kernels and
    ``record_param_comms``.
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
        parser = _span_parser(events, base, kernels_first, whole_us, hta_scope, collectives)
        spans = parser.spans(path, len(events))
        if not collectives:
            return spans
        comm = EventParser(base)  # exact times, whatever rounding the spans had
        comm.feed_comm(parser.comm_raw)
        world = info.get("world_size")
        light = KinetoTrace(path=path, rank=None, world_size=world if isinstance(world, int) else None,
                            backend=None, base_time_ns=base, pg_config=info.get("pg_config"),
                            comm_events=tuple(comm.comm),
                            event_count=len(events))
        return replace(spans, collectives=light)
    finally:
        if gc_was_on:
            gc.enable()


def _span_parser(events: list[Any], base: int, kernels_first: bool, whole_us: bool = False, hta_scope: bool = False,
                 collect: bool = False) -> SpanParser:
    """The span parser fed with a trace's events: the GPU side alone first when ``kernels_first`` (see
    ``read_kineto_spans``), then the CPU side too where no compute or communication kernel turned up."""
    parser = SpanParser(base, whole_us, hta_scope)
    parser.feed_all(events, cpu=not kernels_first, collect=collect)
    if kernels_first and not (parser.gpu_spans["compute"] or parser.gpu_spans["comm"]):
        parser = SpanParser(base, whole_us, hta_scope)  # no kernels: the figures come from the CPU side
        parser.feed_all(events, collect=collect)
    return parser
