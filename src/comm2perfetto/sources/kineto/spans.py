"""The span parser: the event parser's decisions, keeping only begin/end pairs per class of work
(``KinetoSpans``), for ``report``'s time accounting (``reader.read_kineto_spans`` runs it). Three times faster
than building events; its loop is inlined on purpose (see ``SpanParser.feed_all``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from comm2perfetto.intervals import difference, union
from comm2perfetto.sources.kineto.classify import (
    CPU_COMPUTE_KINDS,
    CPU_KIND_SUFFIXES,
    classify_gpu,
    is_training_thread,
)
from comm2perfetto.sources.kineto.events import KinetoSpans, Span
from comm2perfetto.sources.kineto.fields import int_or_none, on_stream, span_ns, span_whole_us
from comm2perfetto.sources.kineto.parse import ROLE_CPU, ROLE_GPU, ROLE_GPU_ANNOTATION, ROLE_LAUNCH, EventParser
from comm2perfetto.sources.kineto.steps import gpu_step_spans, launch_steps

__all__ = ["SpanParser"]


class SpanParser(EventParser):
    """``EventParser``'s decisions (categories, names, threads, kernel classes) keeping only begin/end pairs."""

    def __init__(self, base_ns: int, whole_us: bool = False, hta_scope: bool = False) -> None:
        super().__init__(base_ns)
        self.hta = hta_scope
        self._span = span_whole_us if whole_us else span_ns
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
        A runtime call (a launch) is not wanted as a span: its role is ROLE_LAUNCH. What a CPU span counts as is
        ``classify.cpu_class``'s answer, decided here once per (name, category): a step, communication, or
        compute (an operator or annotation that is neither)."""
        _name, is_comm, is_backend, step = self._name(name)
        kind, role = self._kind(category)
        gpu = self.gpu_spans[classify_gpu(name, category, self.hta)] if role == ROLE_GPU else None
        wanted = step is not None or is_comm or kind in CPU_COMPUTE_KINDS  # runtime calls are neither
        if role == ROLE_CPU and kind.endswith(CPU_KIND_SUFFIXES):
            role = ROLE_LAUNCH
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
            if role == ROLE_GPU:
                span = _span(get("ts"), get("dur"), base)
                if span is None or not on_stream(ev):  # as read_kineto (and HTA): GPU work is on a device's stream
                    continue
                # GPU work always has its class's list (see _plan); no test here, it runs once per kernel
                gpu.append(span)  # type: ignore[union-attr]
                kernels.append((ev, span, gpu))  # type: ignore[arg-type]
                if comm is not None:
                    if cpu:
                        comm.append(span)
                    if collect:
                        comm_raw.append(ev)
            elif role == ROLE_LAUNCH:
                launches.append(ev)
                if cpu:  # it is still a thread's event: the thread is not only a backend's worker
                    pid, tid = get("pid"), get("tid")
                    thread = threads.get((pid, tid)) if pid.__class__ is int and tid.__class__ is int else None
                    if thread is not None:
                        thread.only_backend = False
            elif role == ROLE_CPU:
                if comm is not None and collect:
                    comm_raw.append(ev)
                if step is None and not cpu:
                    continue
                pid, tid = get("pid"), get("tid")
                if pid.__class__ is not int or tid.__class__ is not int:
                    pid, tid = int_or_none(pid), int_or_none(tid)
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
                    thread.comm.append(span)
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
            elif step is not None and role == ROLE_GPU_ANNOTATION:  # ProfilerStep#n projected onto a stream
                span = _span(get("ts"), get("dur"), base)
                if span is not None and span[0] > self.last_step_begin:
                    self.last_step_begin = span[0]

    def spans(self, path: Path, event_count: int) -> KinetoSpans:
        """What was fed, as spans. A training thread's compute is its ops less its communication ops: time in a
        collective is communication also inside the op that called it (gloo's ``c10d::allreduce_`` runs
        inside autograd's ``evaluate_function: AccumulateGrad``, and blocks there while the peers are late)."""
        cpu: list[Span] = []
        for (pid, tid), thread in self.threads.items():
            if is_training_thread(pid, tid, has_steps=thread.has_steps, names=self.thread_names.get((pid, tid), []),
                                  only_backend_annotations=thread.only_backend):
                cpu.extend(difference(union(thread.events), union(thread.comm)) if thread.comm else thread.events)
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
