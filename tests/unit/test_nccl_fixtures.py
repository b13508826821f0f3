"""Real NCCL recordings, read without a GPU: what the readers and the watchdog's rules say about them, checked
against what was seen on the hardware (one H200, torch 2.11.0+cu130, NCCL 2.28.9, world size 1; how each was made
is in tests/data/nccl/README.md). Expected figures are computed here from the raw files, not copied."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from comm2perfetto.diagnose.diagnosis import diagnose
from comm2perfetto.match import load_job
from comm2perfetto.record.flight import FlightRecorderDumps, nccl_unfinished
from comm2perfetto.sources.event_log import read_event_log
from comm2perfetto.sources.safe_pickle import safe_loads
from support.cli import run_cli

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"
COMM_KERNEL = re.compile(r"^nccl|ncclDevKernel|ncclKernel")  # docs/report.md's classification



def _dump(scenario: str, n: int) -> dict:
    return safe_loads((DATA / scenario / f"rank0.fr-nccl.{n}.pkl").read_bytes())


def _calls(scenario: str) -> list:
    return read_event_log(DATA / scenario / "rank0.events.jsonl").calls


def _only(job, op: str | None = None) -> list:
    """The default group's collectives (op ``op``, or all)."""
    (collectives,) = job.collectives.values()
    return [c for c in collectives if op is None or {s.op for s in c.signatures if s is not None} == {op}]


@pytest.mark.parametrize("scenario", ["healthy", "sync", "notiming", "graph", "userprof", "p2pidle"])
def test_diagnose_is_ok_on_the_recordings_where_nothing_went_wrong(scenario):
    d = diagnose(load_job([DATA / scenario]))
    assert (d.status, d.findings, d.ranks_with_data) == ("ok", (), (0,))


def test_a_batched_send_recv_is_read_as_its_send_and_recv_with_the_closing_entrys_state():
    """Each step of ``healthy`` is an all_reduce pair and a batch_isend_irecv to itself. NCCL records the batch
    as a send and a recv that stay scheduled and a closing ``nccl:coalesced`` entry that says ``is_p2p: false``
    and repeats the last all_reduce's ``collective_seq_id``: it must neither swallow that all_reduce nor leave
    the send and recv scheduled."""
    entries = _dump("healthy", 1)["entries"]
    names = [e["profiling_name"] for e in entries]
    closers = [e for e in entries if e["profiling_name"] == "nccl:coalesced"]
    assert len(closers) == 12 and not any(e["is_p2p"] for e in closers)
    assert all(e["state"] == "scheduled" and not e["retired"] for e in entries if e["is_p2p"])
    job = load_job([DATA / "healthy"])
    assert len(_only(job, "all_reduce")) == names.count("nccl:all_reduce") == 26  # 2 before training, 2 a step
    assert not any("coalesced" in str(s.op) for c in _only(job) for s in c.signatures)
    (transfers,) = job.p2p.values()
    assert len(transfers) == names.count("nccl:send 0->0") == 12
    assert {(t.src, t.dst, t.send.state, t.recv.state) for t in transfers} == {(0, 0, "completed", "completed")}


def test_the_held_all_reduce_is_named_and_the_batch_behind_it_completes():
    """``pending``: an async all_reduce (#3) and a batch_isend_irecv held ~6 s behind a long kernel, then
    completed. On the device, diagnose named the closing entry (``coalesced #3``) and called the job stuck; the
    rows must be the all_reduce and the send/recv, and the verdict a stall that resolved: ``ok``, with one
    resolved finding on all_reduce #3 (world size 1: rank 0 waited on its own GPU work, nobody else is blamed)."""
    job = load_job([DATA / "pending"])
    assert [(c.seq, c.signatures[0].op, c.states[0]) for c in _only(job)] == [
        (1, "all_reduce", "completed"), (2, "all_reduce", "completed"), (3, "all_reduce", "completed"),
        (4, "all_reduce", "completed")]
    (transfers,) = job.p2p.values()
    assert [(t.send.state, t.recv.state) for t in transfers] == [("completed", "completed")]
    d = diagnose(job)
    assert d.status == "ok"
    assert [(f.process_group, f.op, f.seq, bool(f.resolved)) for f in d.findings] == [
        ("default_pg", "all_reduce", 3, True)]
    verdict = d.to_json()
    assert verdict["suspect_ranks"] == [] and verdict["culprit_ranks"] == []  # a resolved stall blames nobody


def test_the_live_folder_of_the_held_batch_names_the_all_reduce(tmp_path):
    """The folder as ``diagnose`` saw it on the device while the work was held: the first stall dump and the
    log up to it. The all_reduce is unfinished there (the batch's closing entry reads completed: its CUDA events
    were recorded only after ncclGroupEnd, which on one GPU returned after the hold)."""
    src = DATA / "pending"
    for name in ("rank0.fr-nccl.1.pkl", "rank0.fr.1.pkl", "rank0.stacks.1.json"):
        shutil.copy(src / name, tmp_path / name)
    (tmp_path / ".live").mkdir()
    shutil.copy(src / ".live" / "stall.1.json", tmp_path / ".live" / "stall.1.json")
    lines = (src / "rank0.events.jsonl").read_bytes().splitlines(keepends=True)
    upto = next(i for i, line in enumerate(lines) if b'"rank0.fr-nccl.1.pkl"' in line)
    (tmp_path / "rank0.events.jsonl").write_bytes(b"".join(lines[:upto + 1]))
    stall = _dump("pending", 1)["entries"]
    assert [(e["profiling_name"], e["state"]) for e in stall if e["collective_seq_id"] == 3] == [
        ("nccl:all_reduce", "scheduled"), ("nccl:send 0->0", "scheduled"), ("nccl:recv 0<-0", "scheduled"),
        ("nccl:coalesced", "completed")]
    d = diagnose(load_job([tmp_path]))
    assert d.status != "ok"
    assert [(f.op, f.seq, bool(f.resolved)) for f in d.findings] == [("all_reduce", 3, False)]


@pytest.mark.parametrize("scenario, n, unfinished", [
    ("pending", 1, {("0", "coll"): (3, "nccl:all_reduce")}),  # at the stall: the all_reduce held
    ("pending", 2, {}), ("pending", 3, {}), ("p2pidle", 1, {}), ("p2pidle", 2, {}), ("healthy", 1, {}),
])
def test_the_watchdog_decides_batched_ops_by_their_closing_entry(scenario, n, unfinished):
    """Every dump holds send/recv entries that stay scheduled and unretired for ever; on the device the
    watchdog took them as pending and reported a stall after everything had completed."""
    entries = _dump(scenario, n)["entries"]
    assert any(e["is_p2p"] and e["state"] == "scheduled" and not e["retired"] for e in entries)
    got = nccl_unfinished(entries)
    assert {k: (p.seq, p.name) for k, p in got.items()} == unfinished


def test_no_false_stall_on_the_idle_p2p_job_and_one_ring_read():
    """``p2pidle``'s last dump, as the watchdog's reads would see it for 10 idle seconds with ``--stall-after
    2``: nothing unfinished, the ring read once, every other tick a status read."""
    import pickle

    doc = _dump("p2pidle", 2)
    reads = []

    def ring(*_args):
        reads.append(1)
        return pickle.dumps(doc)

    class _Group:  # the default group, four collectives issued (its status in the dump says so)
        @staticmethod
        def _get_sequence_number_for_group():
            return 4

    class _World:
        def __init__(self) -> None:
            self.pg_map = {_Group(): None}
            self.group_count = 1

    class _C10d:
        _world = _World()

        @staticmethod
        def get_backend_config(_group):
            return "cuda:nccl"

    dumps = FlightRecorderDumps(recorder=None, out_dir=".", buffer_size=20000)
    dumps._c10d, dumps._generic_json, dumps._nccl = _C10d(), None, ring
    dumps._nccl_json = lambda *_a: json.dumps({"pg_status": doc["pg_status"]}).encode()
    now = [10**18]
    dumps._clock = dumps._wall_clock = lambda: now[0]
    for _ in range(20):
        now[0] += 5 * 10**8  # the watchdog's tick at --stall-after 2
        assert dumps.unfinished(2 * 10**9) == {}
    assert reads == [1]


def test_gpu_durations_with_timing_and_none_without():
    """TORCH_NCCL_ENABLE_TIMING (the recorder's default): every retired collective has duration_ms, and the
    reader keeps it; ``--no-gpu-timing``: none has."""
    timed = _dump("healthy", 1)["entries"]
    retired = [e for e in timed if e["retired"]]
    assert retired and all(isinstance(e["duration_ms"], float) for e in retired)
    all_reduce = [e for e in retired if e["profiling_name"] == "nccl:all_reduce"]
    job = load_job([DATA / "healthy"])
    read = [c.duration_ns[0] for c in _only(job, "all_reduce") if c.duration_ns and c.duration_ns[0] is not None]
    assert sorted(read) == sorted(round(e["duration_ms"] * 1e6) for e in all_reduce)
    assert len(read) == 13  # 13 of the 26 all_reduces retired before the exit dump; the others have no time
    untimed = _dump("notiming", 1)["entries"]
    assert untimed and not any(e.get("duration_ms") for e in untimed)
    assert not any(d for c in _only(load_job([DATA / "notiming"])) for d in c.duration_ns)


def test_async_nccl_work_has_no_completion_record_and_flight_recorder_completes_it():
    first = _calls("healthy")[0]
    assert (first.op, first.is_async, first.t_done_ns) == ("all_reduce", True, None)
    (entry,) = [e for e in _dump("healthy", 1)["entries"] if e["collective_seq_id"] == first.seq
                and e["profiling_name"] == "nccl:all_reduce"]
    assert entry["state"] == "completed"


def test_captured_calls_are_left_out_of_matching():
    """``graph``: 40 all_reduces captured into a CUDA graph (``v`` records) and replayed; Flight Recorder has no
    entry for them, and matching does not wait for one."""
    captured = [c for c in _calls("graph") if c.captured]
    assert len(captured) == 40
    seqs = {c.seq for c in captured}
    entries = [e for d in (1, 2) for e in _dump("graph", d)["entries"]]
    assert not seqs & {e["collective_seq_id"] for e in entries}
    matched = {c.seq for c in _only(load_job([DATA / "graph"]))}
    assert not seqs & matched and {1, 2, 3, 4, 5, max(seqs) + 1} <= matched


def test_sync_gives_every_call_a_completion_record():
    """``sync`` was recorded before `e` was stamped ahead of the synchronisation (the device saw `d` 4-5 us
    before `e`); each call has its `d` all the same."""
    calls = _calls("sync")
    assert calls and all(c.t_done_ns is not None for c in calls)


def test_nvtx_ranges_of_several_domains_and_per_domain_contexts():
    log = read_event_log(DATA / "healthy" / "rank0.events.jsonl")
    assert {r.domain for r in log.ranges} >= {"data", "optim", None}
    assert {r.source for r in log.ranges} >= {"nvtx", "torch.cuda.nvtx", "c2p"}
    first, second = log.calls[:2]
    assert (first.nvtx, second.nvtx) == (("outer-data", "inner-default"), ("inner-default",))


def _kernel_spans(path: Path) -> tuple[dict[str, list[tuple[int, int]]], list[tuple[str, int]]]:
    """GPU activity by class (communication kernels by name, memory copies and sets, other kernels compute)
    and the GPU-side ProfilerStep annotations, in ns of the trace's clock."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    spans: dict[str, list[tuple[int, int]]] = {"compute": [], "comm": [], "memory": []}
    steps = []
    for e in doc["traceEvents"]:
        cat, name = e.get("cat"), str(e.get("name"))
        begin = round(e.get("ts", 0) * 1000)
        if cat == "kernel":
            spans["comm" if COMM_KERNEL.search(name) else "compute"].append((begin, begin + round(e["dur"] * 1000)))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            spans["memory"].append((begin, begin + round(e["dur"] * 1000)))
        elif cat == "gpu_user_annotation" and name.startswith("ProfilerStep#"):
            steps.append((name, begin))
    return spans, sorted(steps, key=lambda s: s[1])


def _union_ns(spans: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for b, e in sorted(spans):
        if end is None or b > end:
            total += e - b
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def test_report_on_the_users_profiler_trace_is_on_the_gpu_basis(tmp_path):
    """``userprof``: the job's own torch.profiler with a schedule; the report's figures are unions of the trace's
    GPU kernels (NCCL's ``SendRecv`` kernels the communication: at world size 1 an in-place all_reduce runs no
    kernel, and its PreMulSum kernel ``oneRankReduce`` is not named as NCCL's)."""
    (trace,) = (DATA / "userprof").glob("rank0.kineto.*.json.gz")
    spans, steps = _kernel_spans(trace)
    assert run_cli("report", str(DATA / "userprof"), "--format", "json", "-o", str(tmp_path / "r.json")).code == 0
    doc = json.loads((tmp_path / "r.json").read_text())
    everything = spans["compute"] + spans["comm"] + spans["memory"]
    span_ns = max(e for _, e in everything) - min(b for b, _ in everything)
    rank = doc["ranks"]["0"]
    assert (doc["basis"], rank["basis"], rank["sources"]) == ("gpu", "gpu", ["profiler GPU kernels"])
    ns = pytest.approx
    assert rank["span_s"] == ns(span_ns / 1e9, abs=3e-9)
    assert rank["compute_s"] == ns(_union_ns(spans["compute"]) / 1e9, abs=3e-9)
    assert rank["comm_s"] == ns(_union_ns(spans["comm"]) / 1e9, abs=3e-9)
    assert rank["idle_s"] == ns((span_ns - _union_ns(everything)) / 1e9, abs=3e-9)
    assert len(spans["comm"]) == 3 and rank["overlap_pct"] == 0.0
    assert [s["step"] for s in doc["steps"]] == [int(name.rpartition("#")[2]) for name, _ in steps] == [2, 3, 4]
    for row, (_, begin), (_, end) in zip(doc["steps"], steps, steps[1:]):  # a GPU step lasts until the next
        assert row["job"]["span_s"] == ns((end - begin) / 1e9, abs=3e-9)
        assert row["job"]["comm_s"] == ns(_union_ns([s for s in spans["comm"] if begin <= s[0] < end]) / 1e9,
                                          abs=3e-9)


def test_the_merged_trace_draws_gpu_time_or_none_and_the_gpu_steps(tmp_path):
    """``userprof`` merged (the second GPU run's failure: recorder step marks hid the profiler's GPU steps; the
    watchdog-discovered ends fanned one group out over 17 lanes). A collective is drawn for its ``duration_ms``
    from its enqueue; a send/recv and a collective without GPU time are instants at their enqueue, saying why
    (the send/recv the profiler traced are drawn as their kernels:
    ``test_the_send_recv_batches_the_profiler_traced_are_timed_by_their_kernels``);
    the profiler's ``ProfilerStep#n`` on the GPU get their track beside the recorder's steps."""
    from comm2perfetto.trace.check import check_trace

    out = tmp_path / "job.pftrace"
    assert run_cli("merge", str(DATA / "userprof"), "-o", str(out)).code == 0
    trace = check_trace(out)
    entries = [e for n in (1,) for e in _dump("userprof", n)["entries"]]
    timed = {e["collective_seq_id"]: round(e["duration_ms"] * 1e6) for e in entries
             if not e["is_p2p"] and e.get("duration_ms") is not None and e["profiling_name"] != "nccl:coalesced"}
    lanes = [t.name for t in trace.tracks_of("rank 0") if t.name.startswith("default_pg")]
    assert lanes == ["default_pg"]
    drawn = [e for e in trace.events_on("default_pg", process_name="rank 0") if e.name != "coalesced"]
    slices = {e.args["seq"]: e.dur for e in drawn if e.kind == "slice" and e.name not in ("send", "recv")}
    assert timed and {seq: slices.get(seq) for seq in timed} == timed
    untimed = [e for e in drawn if e.kind == "instant"]
    assert {e.name for e in untimed} >= {"send", "recv"}
    assert all(e.args["duration"].startswith("unknown: its GPU work was not timed") for e in untimed)
    gpu_steps = [e.name for e in trace.events_on("steps (GPU)", process_name="rank 0")]
    assert gpu_steps == ["step 2", "step 3", "step 4"]
    marked = [f"step {n}" for n, _t, _source in read_event_log(DATA / "userprof" / "rank0.events.jsonl").steps]
    assert [e.name for e in trace.events_on("steps", process_name="rank 0")] == marked != []


def test_a_group_of_one_rank_has_no_bandwidth_and_the_report_says_its_scope():
    """``userprof`` runs on one GPU: nothing crossed a link, so no algbw/busbw (a note says why), the batched
    send/recv to itself is a group of one with no arrival skew; its group's name is printed whole. Without
    --steps the header and the collectives say they cover the whole run (its 22 all_reduces, not those of the
    3 steps listed); with --steps, both say those steps."""
    ran = run_cli("report", str(DATA / "userprof"))
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert lines[0] == "comm2perfetto report: 1 rank, basis gpu, the whole run (3 steps: 2-4)"
    assert "collectives of the whole run (by total time)" in lines
    rows = {line.split()[0]: line.split() for line in lines if line.startswith(("all_reduce ", "send/recv "))}
    all_reduces = sum(1 for e in _dump("userprof", 1)["entries"] if e["profiling_name"] == "nccl:all_reduce")
    assert rows["all_reduce"][1:4] == ["default_pg", "1", f"4/{all_reduces}"] and all_reduces == 22
    assert rows["all_reduce"][-3:] == rows["send/recv"][-3:] == ["-", "-", "-"]  # algbw, busbw, skew
    assert rows["send/recv"][2] == "1"
    assert "no algbw/busbw on default_pg: a group of one rank moves nothing over a link" in " ".join(
        ran.out.split())
    scoped = run_cli("report", str(DATA / "userprof"), "--steps", "2-4")
    assert scoped.out.splitlines()[0] == "comm2perfetto report: 1 rank, basis gpu, steps 2-4"
    assert "collectives of steps 2-4 (by total time)" in scoped.out.splitlines()


def _notes(scenario: str) -> list[str]:
    ran = run_cli("report", str(DATA / scenario), "--format", "json")
    assert ran.code == 0, ran.err
    return json.loads(ran.out)["notes"]


def test_each_untimed_collective_says_its_own_cause():
    """GPU timing was on in ``healthy`` (13 entries carry duration_ms): the others were not yet retired when
    Flight Recorder dumped, and the send/recv pairs have nothing timing them; in ``notiming`` timing was off."""
    entries = _dump("healthy", 1)["entries"]
    untimed = [e for e in entries if not e["is_p2p"] and e["profiling_name"] != "nccl:coalesced"
               and e.get("duration_ms") is None]
    assert untimed and not any(e["retired"] for e in untimed)
    pairs = sum(1 for e in entries if e["is_p2p"] and e["profiling_name"].startswith("nccl:send"))
    (note,) = [n for n in _notes("healthy") if "have no duration" in n]
    assert f"{len(untimed)} not yet retired when Flight Recorder last dumped" in note
    assert f"{pairs} a send/recv on a GPU" in note and "TORCH_NCCL_ENABLE_TIMING=0" not in note
    (off,) = [n for n in _notes("notiming") if "have no duration" in n]
    total = sum(1 for e in _dump("notiming", 1)["entries"] if not e["is_p2p"])
    assert off.startswith(f"{total} of {total} collectives") and off.endswith(f": {total} GPU timing was off "
                                                                              "(recorded with --no-gpu-timing)")


def test_the_send_recv_batches_the_profiler_traced_are_timed_by_their_kernels(tmp_path):
    """``userprof``: 10 batched send/recv to itself, the 3 of steps 2-4 traced. Their ``SendRecv`` kernels carry
    no External id: joined by order to the batches' ``nccl:coalesced`` annotations, they time those 3 (every
    untimed send/recv read "no profiler trace of its kernels", which was false of those); the other 7 keep that
    reason, now true; the merged trace draws the 3 batches' ops as their kernels."""
    from comm2perfetto.trace.check import check_trace

    (path,) = (DATA / "userprof").glob("rank0.kineto.*.json.gz")
    raw = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    kernels = sorted((round(e["ts"] * 1000), round(e["dur"] * 1000)) for e in raw
                     if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_SendRecv"))
    assert len(kernels) == 3 and not any("External id" in e["args"] for e in raw
                                         if e.get("cat") == "kernel" and "SendRecv" in e["name"])
    base = json.loads(gzip.decompress(path.read_bytes()))["baseTimeNanoseconds"]
    doc = json.loads(run_cli("report", str(DATA / "userprof"), "--format", "json").out)
    (row,) = [r for r in doc["collectives"] if r["op"] == "send/recv"]
    assert (row["count"], row["timed"]) == (10, 3)
    assert sorted(d for d in row["instances"]["duration_s"] if d is not None) == pytest.approx(
        sorted(dur * 1e-9 for _, dur in kernels), abs=1e-12)
    (note,) = [n for n in doc["notes"] if "have no duration" in n]
    assert "; 7 a send/recv on a GPU: no profiler trace of its kernels" in note
    out = tmp_path / "job.pftrace"
    assert run_cli("merge", str(DATA / "userprof"), "-o", str(out)).code == 0
    p2p = [e for e in check_trace(out).events_on("default_pg", process_name="rank 0") if e.name in ("send", "recv")]
    drawn = sorted((e.ts, e.dur) for e in p2p if e.kind == "slice")
    assert drawn == sorted((base + ts, dur) for ts, dur in kernels for _op in ("send", "recv"))
    assert len(p2p) - len(drawn) == 2 * 7


def test_collectives_captured_in_a_cuda_graph_are_said_not_counted():
    """``graph``: the 40 captured all_reduces ran at each of 5 replays, which nothing recorded; every table counts
    the 6 issued outside the capture, and a note says how many were captured and that they are not counted."""
    captured = sum(1 for c in _calls("graph") if c.captured)
    ran = run_cli("report", str(DATA / "graph"), "--format", "json")
    doc = json.loads(ran.out)
    issued = len(_only(load_job([DATA / "graph"])))
    assert [(r["op"], r["count"]) for r in doc["collectives"]] == [("all_reduce", issued)] and issued == 6
    assert [(m["op"], m["count"]) for m in doc["modules"]] == [("all_reduce", issued)]
    (note,) = [n for n in doc["notes"] if "CUDA graph" in n]
    assert note.startswith(f"captured into a CUDA graph and not counted in any table: {captured} all_reduce on "
                           "default_pg (rank 0)") and captured == 40
