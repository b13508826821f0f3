"""The event parser: one pass over a trace's raw ``traceEvents`` into ``KinetoEvent``s and ``KinetoCommEvent``s
(``reader.read_kineto`` runs it). The span parser (``spans``) extends it.

The loop over the events is the reader's hot path, written for speed on purpose: a trace has millions of
events but a few thousand names, a handful of categories and threads, so whatever follows from those is decided
once and cached; the common case (float ts/dur, int pid/tid/ids) is tested by type before anything slower.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import orjson

from comm2perfetto.sources.kineto.classify import (
    BACKEND_ANNOTATION,
    COMM_NAME,
    CPU_KIND_SUFFIXES,
    CPU_KINDS,
    GPU_ANNOTATION_KIND,
    GPU_WORK_KINDS,
    PROFILER_STEP,
    classify_gpu,
    is_training_thread,
    normalise_kind,
)
from comm2perfetto.sources.kineto.events import (
    NO_ARGS,
    NOT_DETAIL,
    SHOWN_ARG_SET,
    SHOWN_ARGS,
    ArgValue,
    Detail,
    KinetoCommEvent,
    KinetoEvent,
    KinetoTrace,
)
from comm2perfetto.sources.kineto.fields import int_or_none, span_ns, stream_from_tid
from comm2perfetto.sources.kineto.steps import gpu_step_spans, launch_steps, profiler_steps

__all__ = ["MAX_ARG_TEXT", "ROLE_CPU", "ROLE_GPU", "ROLE_GPU_ANNOTATION", "ROLE_LAUNCH", "ROLE_SKIP", "EventParser"]

_dumps = orjson.dumps

# An arg's text (a string, or a list's JSON) is cut to this many characters: what a person reads in the UI.
MAX_ARG_TEXT = 2000
# At most this many detail args an event (Kineto writes up to about 15).
MAX_DETAIL_ARGS = 64

class _Thread:
    """What the parser gathers about one CPU thread: its KinetoEvents (the span parser: its compute spans, and
    in ``comm`` the spans of its communication ops)."""

    __slots__ = ("comm", "events", "has_steps", "lane", "only_backend")

    def __init__(self, tid: int) -> None:
        self.lane = f"thread {tid}"
        self.events: list[Any] = []
        self.comm: list[Any] = []
        self.only_backend = True  # every event so far is a backend annotation ("gloo:all_reduce")
        self.has_steps = False


# What a category means to the parser: skipped, a CPU event, GPU work, or a GPU annotation (ROLE_LAUNCH: a
# runtime/driver call, to the span parser).
ROLE_SKIP, ROLE_CPU, ROLE_GPU, ROLE_GPU_ANNOTATION, ROLE_LAUNCH = range(5)


class EventParser:
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
        self._kinds: dict[str, tuple[str, int]] = {}  # category -> (kind, its ROLE_*)
        self._klasses: dict[tuple[str, str], str] = {}  # (kernel name, category) -> classify_gpu
        self._strings: dict[str, str] = {}
        self._details: dict[bytes, Detail] = {}  # the detail args' JSON -> their one Detail

    def _intern(self, text: str) -> str:
        return self._strings.setdefault(text, text)

    def _name(self, name: str) -> tuple[str, bool, bool, int | None]:
        info = self._names.get(name)
        if info is None:
            step = PROFILER_STEP.match(name)
            info = (name, bool(COMM_NAME.search(name)), bool(BACKEND_ANNOTATION.match(name)),
                    int(step.group(1)) if step else None)
            self._names[name] = info
        return info

    def _kind(self, category: str) -> tuple[str, int]:
        known = self._kinds.get(category)
        if known is None:
            kind = normalise_kind(category)
            if kind in GPU_WORK_KINDS:
                role = ROLE_GPU
            elif kind == GPU_ANNOTATION_KIND:
                role = ROLE_GPU_ANNOTATION
            elif kind in CPU_KINDS or kind.endswith(CPU_KIND_SUFFIXES):
                role = ROLE_CPU
            else:
                role = ROLE_SKIP
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
        span = span_ns(ts, dur, self.base)
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
        if role == ROLE_SKIP:
            return
        shown = NO_ARGS if SHOWN_ARG_SET.isdisjoint(args) else self._args(args)
        detail = self._detail(args) if args else ()
        external, correlation = args.get("External id"), args.get("correlation")
        if external is not None and external.__class__ is not int:
            external = int_or_none(external)
        if correlation is not None and correlation.__class__ is not int:
            correlation = int_or_none(correlation)
        if role == ROLE_CPU:
            pid, tid = get("pid"), get("tid")
            if pid.__class__ is not int or tid.__class__ is not int:
                pid, tid = int_or_none(pid), int_or_none(tid)
                if pid is None or tid is None:  # Kineto's own rows ("Spans", "Traces") are not threads
                    return
            thread = self.threads.get((pid, tid)) or self._thread(pid, tid)
            thread.events.append(KinetoEvent(name, begin, duration, thread.lane, kind, None, shown, external,
                                             correlation, detail))
            if not is_backend:
                thread.only_backend = False
            if step is not None:
                thread.has_steps = True
            return
        # A GPU event: Kineto writes the device as pid and the stream as tid, and both again in args.
        device, stream = args.get("device"), args.get("stream")
        if device.__class__ is not int:
            device = int_or_none(device)
            if device is None:
                device = int_or_none(get("pid"))
        if stream.__class__ is not int:
            stream = int_or_none(stream)
            if stream is None:
                stream = stream_from_tid(get("tid"))
        if device is None or stream is None:
            return
        lane = self.gpu_lanes.get((device, stream)) or self._gpu_lane(device, stream)
        if role == ROLE_GPU_ANNOTATION:
            self.gpu_ann.append(KinetoEvent(name, begin, duration, lane, kind, None, shown, external, correlation,
                                            detail))
        else:
            klass = self._klasses.get((name, category)) or self._klass(name, category)
            self.gpu.append(KinetoEvent(name, begin, duration, lane, kind, klass, shown, external, correlation,
                                        detail))

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
            span = span_ns(get("ts"), get("dur"), base)
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
            seq=int_or_none(get("Seq")), pg_name=self._intern(str(pg_name)) if pg_name is not None else None,
            pg_desc=self._intern(desc) if isinstance(desc, str) else None,
            pg_ranks=self._intern(ranks) if isinstance(ranks, str) else None,
            in_nelems=int_or_none(get("In msg nelems")), out_nelems=int_or_none(get("Out msg nelems")),
            dtype=self._intern(dtype) if isinstance(dtype, str) else None,
            external_id=int_or_none(get("External id")),
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
        return kept if kept else NO_ARGS

    def _detail(self, args: dict[str, Any]) -> Detail:
        """The event's other args (``events.Detail``), one shared copy per distinct set; values checked here:
        numbers and strings as they are (strings cut to ``MAX_ARG_TEXT``), lists and objects as their JSON
        text, anything else (null) left out. Keyed by the args' JSON (values may be lists: unhashable), which
        costs less than looking at each value of every event."""
        rest = {key: value for key, value in args.items() if key not in NOT_DETAIL}
        if not rest:
            return ()
        text = _dumps(rest)
        known = self._details.get(text)
        if known is not None:
            return known
        kept: list[tuple[str, ArgValue]] = []
        for key, value in list(rest.items())[:MAX_DETAIL_ARGS]:
            kind = value.__class__
            if kind is int or kind is float or kind is bool:
                kept.append((key, value))
            elif kind is str:
                kept.append((key, self._intern(value[:MAX_ARG_TEXT])))
            elif kind is list or kind is dict:
                kept.append((key, self._intern(_dumps(value).decode()[:MAX_ARG_TEXT])))
        detail = self._details[text] = tuple(kept)
        return detail

    def _metadata(self, ev: dict[str, Any]) -> None:
        if ev.get("name") != "thread_name":
            return
        pid, tid = int_or_none(ev.get("pid")), int_or_none(ev.get("tid"))
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
        steps = profiler_steps(cpu_ops)
        launches = {ev.correlation: ev.t_begin_ns for ev in cpu_ops
                    if ev.correlation is not None and ev.kind.endswith(CPU_KIND_SUFFIXES)}
        launched = launch_steps(steps, launches, ((ev.correlation, ev.t_begin_ns) for ev in self.gpu))
        return KinetoTrace(
            comm_events=tuple(self.comm), cpu_ops=tuple(cpu_ops), gpu_events=tuple(self.gpu),
            gpu_annotations=tuple(self.gpu_ann), steps=steps,
            gpu_steps=gpu_step_spans(steps, launched, ((ev.t_begin_ns, ev.t_end_ns) for ev in self.gpu)),
            pid=pids.most_common(1)[0][0] if pids else None, lane_names=lane_names,
            skipped_threads=tuple(skipped), **fields,
        )

