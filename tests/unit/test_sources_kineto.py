"""Kineto (torch.profiler) traces: recognised and read without torch.

Synthetic traces come from ``kineto_fixtures``; the real one is rank 0 of a gloo DDP job (tests/data/kineto).
Expected values are computed from the raw documents, with decimal arithmetic for times.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from decimal import Decimal
from pathlib import Path

import pytest

from comm2perfetto.sources.kineto.classify import classify_gpu, normalise_kind
from comm2perfetto.sources.kineto.events import KinetoEvent
from comm2perfetto.sources.kineto.fields import span_ns
from comm2perfetto.sources.kineto.reader import KinetoFormatError, read_kineto, sniff_kineto
from support.factories import T0_NS
from support.kineto_fixtures import (
    COMM,
    COMPUTE,
    COMPUTE_STREAM,
    MEMORY,
    NCCL_STREAM,
    TS0,
    KinetoDoc,
    training_doc,
)

REAL = Path(__file__).parent.parent / "data" / "kineto" / "gloo_ddp_rank0.json.gz"
CPU_CATEGORIES = {"cpu_op", "user_annotation", "python_function", "cuda_runtime"}

DOC = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 8},
       "baseTimeNanoseconds": T0_NS,
       "traceEvents": [
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0},
           {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "pid": 0, "tid": 7,
            "ts": 12.5, "dur": 80.25, "args": {"Collective name": "allreduce", "Seq": 5,
                                               "Process Group Name": "0"}},
           {"ph": "i", "name": "marker", "ts": 3.0}]}


@pytest.mark.parametrize("gz", [False, True])
def test_read_kineto(tmp_path, gz):
    raw = json.dumps(DOC).encode()
    path = tmp_path / ("t.json.gz" if gz else "t.json")
    path.write_bytes(gzip.compress(raw) if gz else raw)
    trace = read_kineto(path)
    assert (trace.rank, trace.world_size, trace.backend, trace.event_count) == (3, 8, "nccl", 3)
    (ev,) = trace.comm_events
    assert ev.t_begin_ns == T0_NS + int(12.5 * 1000) and ev.duration_ns == int(80.25 * 1000)
    assert (ev.collective, ev.seq, ev.pg_name) == ("allreduce", 5, "0")
    assert sniff_kineto(raw[:200])


def test_not_a_kineto_trace(tmp_path):
    (tmp_path / "x.json").write_text('{"entries": []}')
    with pytest.raises(KinetoFormatError, match="no traceEvents"):
        read_kineto(tmp_path / "x.json")
    (tmp_path / "y.json.gz").write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(KinetoFormatError, match="not a readable Kineto trace"):
        read_kineto(tmp_path / "y.json.gz")


# --- times ------------------------------------------------------------------------------------------------


def _exact_ns(text: str) -> int:
    return int(Decimal(text) * 1000)


@pytest.mark.parametrize("text", ["4453700846418.643", "4464633909866.391", "0.001", "12.5", "8796093022207.999"])
def test_microseconds_become_the_written_nanoseconds(text):
    assert span_ns(float(text), float(text), 0) == (_exact_ns(text), 2 * _exact_ns(text))


def test_rounding_matters_where_truncation_and_a_rounded_product_both_miss():
    # Guards the test above: this ts is one that the naive conversions get wrong.
    text = "4453700846418.643"
    assert int(float(text) * 1000) != _exact_ns(text) and round(float(text) * 1000) != _exact_ns(text)


def test_absolute_times_of_every_event(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json.gz"))
    assert trace.base_time_ns == doc.base_ns
    kept = scene.cpu_kept + [ev for ev, _klass in scene.gpu]
    want = Counter((ev["name"], doc.absolute_ns(ev["ts"]), _exact_ns(repr(ev["dur"]))) for ev in kept)
    got = Counter((ev.name, ev.t_begin_ns, ev.duration_ns) for ev in trace.cpu_ops + trace.gpu_events)
    assert got == want


# --- classification ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "category", "klass"), [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "kernel", COMM),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "kernel", COMM),
    ("void ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "kernel", COMM),
    ("ncclDevKernel_Generic", "Kernel", COMM),  # Kineto before torch 1.10 wrote "Kernel"
    ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", MEMORY),
    ("Memcpy DtoD (Device -> Device)", "Memcpy", MEMORY),
    ("Memset (Device)", "gpu_memset", MEMORY),
    ("Memcpy PtoP (Device -> Device)", "kernel", MEMORY),  # a copy by name, whatever its category
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32", "kernel", COMPUTE),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", "kernel", COMPUTE),
    ("triton_poi_fused_add_0", "kernel", COMPUTE),
    ("my_nccl_like_kernel", "kernel", COMPUTE),  # "nccl" inside a name is not NCCL's
    ("gloo:all_reduce", "kernel", COMM),  # HTA counts gloo's annotations as comm too
])
def test_gpu_classification(name, category, klass):
    assert classify_gpu(name, category) == klass


@pytest.mark.parametrize(("category", "kind"), [
    ("cpu_op", "cpu_op"), ("Operator", "cpu_op"), ("Kernel", "kernel"), ("Memcpy", "gpu_memcpy"),
    ("Memset", "gpu_memset"), ("Runtime", "cuda_runtime"), ("cuda_runtime", "cuda_runtime"),
    ("python_function", "python_function"), ("gpu_user_annotation", "gpu_user_annotation"),
])
def test_kinds_are_normalised(category, kind):
    assert normalise_kind(category) == kind


def test_gpu_events_are_classified_and_annotations_kept_apart(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    want = Counter((ev["name"], doc.absolute_ns(ev["ts"]), klass, f"gpu {doc.device} stream {ev['tid']}")
                   for ev, klass in scene.gpu)
    assert Counter((ev.name, ev.t_begin_ns, ev.klass, ev.lane) for ev in trace.gpu_events) == want
    assert {ev.kind for ev in trace.gpu_events} == {ev["cat"] for ev, _klass in scene.gpu}
    assert [(ev.name, ev.kind, ev.klass) for ev in trace.gpu_annotations] == \
        [(ev["name"], "gpu_user_annotation", None) for ev in sorted(scene.gpu_annotations, key=lambda e: e["ts"])]
    assert trace.lane_names[f"gpu {doc.device} stream {NCCL_STREAM}"] == f"GPU {doc.device} stream {NCCL_STREAM}"


def test_only_the_args_worth_showing_are_kept(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    kernel = next(ev for ev, _k in scene.gpu if ev["name"].startswith("ncclDevKernel"))
    got = next(ev for ev in trace.gpu_events if ev.name == kernel["name"] and ev.args["Seq"] == kernel["args"]["Seq"])
    raw = kernel["args"]
    # Ids become fields; device and stream are the lane; Kineto's per-kernel statistics are dropped.
    assert (got.external_id, got.correlation) == (raw["External id"], raw["correlation"])
    assert got.lane == f"gpu {raw['device']} stream {raw['stream']}"
    moved_or_dropped = {"External id", "correlation", "device", "stream", "registers per thread", "grid"}
    assert moved_or_dropped <= raw.keys() and not moved_or_dropped & got.args.keys()
    assert dict(got.args) == {k: v for k, v in raw.items() if k not in moved_or_dropped}
    rpc_raw = next(ev for ev in scene.cpu_kept if ev["name"] == "record_param_comms")
    rpc = next(ev for ev in trace.cpu_ops
               if ev.name == "record_param_comms" and ev.args["Seq"] == rpc_raw["args"]["Seq"])
    assert rpc.args["Collective name"] == "allreduce" and "Process Group Ranks" not in rpc.args
    assert rpc.external_id == rpc_raw["args"]["External id"] and rpc.correlation is None
    launch = next(ev for ev in trace.cpu_ops if ev.name == "cudaLaunchKernel")
    assert launch.args == {} and launch.correlation is not None


# --- threads, steps, order --------------------------------------------------------------------------------


def test_training_threads_exclude_comm_workers_and_tid_0(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json.gz"))
    assert trace.pid == doc.pid
    assert {ev.lane for ev in trace.cpu_ops} == {f"thread {scene.main}", f"thread {scene.autograd}"}
    assert set(trace.skipped_threads) == {f"thread {ev['tid']}" for ev in scene.cpu_dropped}
    assert Counter((ev.lane, ev.name) for ev in trace.cpu_ops) == \
        Counter((f"thread {ev['tid']}", ev["name"]) for ev in scene.cpu_kept)
    assert trace.lane_names[f"thread {scene.autograd}"] == f"thread {scene.autograd} (pt_autograd_0)"
    kinds = {ev.name: ev.kind for ev in trace.cpu_ops}
    assert kinds["cudaLaunchKernel"] == "cuda_runtime" and kinds["ProfilerStep#2"] == "user_annotation"
    assert all(ev.klass is None for ev in trace.cpu_ops)


def test_comm_workers_collectives_stay_in_comm_events(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    comm_cpu = [ev for ev in scene.cpu_kept + scene.cpu_dropped
                if ev["name"].startswith(("gloo:", "c10d::", "record_param_comms"))]
    comm_gpu = [ev for ev, klass in scene.gpu if klass == COMM]
    assert Counter((ev.name, ev.tid) for ev in trace.comm_events) == \
        Counter((ev["name"], ev["tid"]) for ev in comm_cpu + comm_gpu)
    nccl = [ev for ev in trace.comm_events if ev.name.startswith("ncclDevKernel")]
    assert sorted(ev.seq for ev in nccl) == sorted(ev["args"]["Seq"] for ev in comm_gpu if "Seq" in ev["args"])


def test_steps_from_profiler_step_annotations(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    want = sorted((int(ev["name"].split("#")[1]), doc.absolute_ns(ev["ts"]),
                   doc.absolute_ns(ev["ts"]) + _exact_ns(repr(ev["dur"]))) for ev in scene.steps)
    assert list(trace.steps) == want


def _lane_key(lane: str) -> tuple[int, ...]:
    """Lanes in numeric order, threads before GPU streams: an order independent of the reader's."""
    numbers = tuple(int(part) for part in lane.split() if part.isdigit())
    return (lane.startswith("gpu"), *numbers)


def _assert_sorted(events: tuple[KinetoEvent, ...]) -> None:
    keys = [(_lane_key(ev.lane), ev.t_begin_ns, -ev.duration_ns) for ev in events]
    assert keys == sorted(keys)


def test_events_sorted_by_lane_then_time_parents_first(tmp_path):
    doc, _scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    _assert_sorted(trace.cpu_ops)
    _assert_sorted(trace.gpu_events)
    gpu_lanes = list(dict.fromkeys(ev.lane for ev in trace.gpu_events))
    assert gpu_lanes == [f"gpu {doc.device} stream {s}" for s in sorted((COMPUTE_STREAM, NCCL_STREAM))]
    # A parent and its first child begin together: the parent (longer) comes first.
    names = [ev.name for ev in trace.cpu_ops]
    assert names.index("train.py(57): train_step") + 1 == names.index("aten::mm")


def test_malformed_events_are_skipped(tmp_path):
    doc, scene = training_doc()
    trace = read_kineto(doc.write(tmp_path / "t.json"))
    assert trace.event_count == len(doc.events)
    bad_names = {ev["name"] for ev in scene.garbage if isinstance(ev, dict) and ev["name"]}
    assert not bad_names & {ev.name for ev in trace.cpu_ops + trace.gpu_events + trace.comm_events}


def test_args_that_are_not_a_dict_and_old_absolute_timestamps(tmp_path):
    # Traces from before baseTimeNanoseconds carry absolute ts.
    doc = KinetoDoc(base_ns=0)
    doc.thread(doc.pid, "python")
    doc.raw({"ph": "X", "cat": "Operator", "name": "aten::add", "pid": doc.pid, "tid": doc.pid,
             "ts": 1_795_313_447_000_000.5, "dur": 3, "args": ["not", "a", "dict"]})
    doc_dict = doc.document()
    del doc_dict["baseTimeNanoseconds"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc_dict))
    (ev,) = read_kineto(path).cpu_ops
    assert (ev.name, ev.kind, ev.t_begin_ns, ev.duration_ns, dict(ev.args)) == \
        ("aten::add", "cpu_op", _exact_ns("1795313447000000.5"), 3000, {})


@pytest.mark.parametrize("cut", [0.5, 0.95])
def test_truncated_files_name_the_file(tmp_path, cut):
    data = REAL.read_bytes()
    for name, body in (("cut.json.gz", data[:int(len(data) * cut)]),
                       ("cut.json", gzip.decompress(data)[:int(len(gzip.decompress(data)) * cut)])):
        path = tmp_path / name
        path.write_bytes(body)
        with pytest.raises(KinetoFormatError, match=re.escape(f"{path}: not a readable Kineto trace")):
            read_kineto(path)


def test_a_json_list_is_not_a_trace(tmp_path):
    path = tmp_path / "list.json"
    path.write_text('[{"ph": "X"}]')
    with pytest.raises(KinetoFormatError, match=re.escape(f"{path}: not a Kineto trace")):
        read_kineto(path)


# --- the real trace ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real():
    """The reader's view and the raw document (floats as Decimal: the exact written values)."""
    raw = json.loads(gzip.decompress(REAL.read_bytes()), parse_float=Decimal)
    return read_kineto(REAL), raw


def _raw_ns(raw: dict, value: Decimal) -> int:
    return raw["baseTimeNanoseconds"] + int(value * 1000)


def _thread_names(raw: dict) -> dict[int, list[str]]:
    names: dict[int, list[str]] = {}
    for ev in raw["traceEvents"]:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names.setdefault(ev["tid"], []).append(ev["args"]["name"])
    return names


def test_real_trace_header(real):
    trace, raw = real
    info = raw["distributedInfo"]
    assert (trace.rank, trace.world_size, trace.backend) == (info["rank"], info["world_size"], "gloo")
    assert trace.pg_config == info["pg_config"] and trace.base_time_ns == raw["baseTimeNanoseconds"]
    assert sniff_kineto(gzip.decompress(REAL.read_bytes())[:4096])


def test_real_trace_steps(real):
    trace, raw = real
    want = sorted((int(ev["name"].split("#")[1]), _raw_ns(raw, ev["ts"]), _raw_ns(raw, ev["ts"] + ev["dur"]))
                  for ev in raw["traceEvents"] if ev.get("name", "").startswith("ProfilerStep#"))
    assert [n for n, _b, _e in want] == [2, 3]  # what the recording script's schedule asks for
    assert list(trace.steps) == want


def test_real_trace_cpu_ops_are_the_main_threads(real):
    trace, raw = real
    main = trace.pid
    assert all(ev["pid"] == main for ev in raw["traceEvents"] if ev.get("cat") == "cpu_op")
    assert {ev.lane for ev in trace.cpu_ops} == {f"thread {main}"}
    want = Counter((ev["name"], ev["cat"], _raw_ns(raw, ev["ts"]), int(ev["dur"] * 1000))
                   for ev in raw["traceEvents"]
                   if ev.get("ph") == "X" and ev.get("cat") in CPU_CATEGORIES and ev["tid"] == main)
    assert Counter((ev.name, ev.kind, ev.t_begin_ns, ev.duration_ns) for ev in trace.cpu_ops) == want
    assert {ev.kind for ev in trace.cpu_ops} == {"cpu_op", "user_annotation", "python_function"}
    assert trace.gpu_events == () and trace.gpu_annotations == ()
    _assert_sorted(trace.cpu_ops)


def test_real_trace_skips_gloo_workers_and_tid_0(real):
    trace, raw = real
    names = _thread_names(raw)
    gloo = {tid for tid, labels in names.items() if any("pt_gloo_runloop" in label for label in labels)}
    assert len(gloo) == 2  # gloo's worker threads, one of them first named "(python)"
    assert any("(python)" in label for tid in gloo for label in names[tid])
    tid0 = [ev for ev in raw["traceEvents"] if ev.get("tid") == 0 and ev.get("ph") == "X"]
    assert tid0 and any("watchdog" in ev["name"] for ev in tid0)  # comm2perfetto's own thread
    assert set(trace.skipped_threads) == {f"thread {tid}" for tid in gloo | {0}}
    assert trace.lane_names == {f"thread {trace.pid}": names[trace.pid][-1]}


def test_real_trace_comm_events_on_the_expected_threads(real):
    trace, raw = real
    gloo = {tid for tid, labels in _thread_names(raw).items() if any("gloo" in label for label in labels)}
    c10d = [ev for ev in trace.comm_events if ev.name.startswith("c10d::")]
    workers = [ev for ev in trace.comm_events if ev.name.startswith("gloo:")]
    assert len(c10d) + len(workers) == len(trace.comm_events)
    assert {ev.tid for ev in c10d} == {trace.pid} and {ev.tid for ev in workers} <= gloo
    # Each collective the main thread issues runs once on a gloo worker: same ops, same counts.
    assert Counter(ev.name.removeprefix("c10d::").rstrip("_").replace("allreduce", "all_reduce") for ev in c10d) \
        == Counter(ev.name.removeprefix("gloo:") for ev in workers)
    want = Counter((ev["name"], _raw_ns(raw, ev["ts"])) for ev in raw["traceEvents"]
                   if ev.get("name", "").startswith(("c10d::", "gloo:")))
    assert Counter((ev.name, ev.t_begin_ns) for ev in trace.comm_events) == want


def test_synthetic_times_are_of_real_magnitude(real):
    # The fixture's ts must exercise the same float precision as real traces do.
    _trace, raw = real
    first = min(ev["ts"] for ev in raw["traceEvents"] if ev.get("ph") == "X" and ev.get("cat") == "cpu_op")
    assert math.floor(math.log2(float(first))) == math.floor(math.log2(TS0))
