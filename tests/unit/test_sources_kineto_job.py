"""Profiler traces as a source of the job: ranks, collectives, alignment, FR joins, mixed jobs, merge/diagnose."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from comm2perfetto.load_options import LoadOptions, Traces
from comm2perfetto.match import load_job
from comm2perfetto.sources.checks import MixedJobsError
from comm2perfetto.sources.discover import SourceError
from comm2perfetto.sources.kineto.classify import classify_gpu
from comm2perfetto.sources.kineto.collectives import collectives_of, op_name
from comm2perfetto.sources.kineto.comm_kernels import comm_family
from comm2perfetto.sources.kineto.p2p import p2p_batches
from comm2perfetto.sources.kineto.rank import distributed_info, rank_from_trace_name
from comm2perfetto.sources.kineto.reader import read_kineto
from comm2perfetto.sources.kineto.steps import gpu_step_spans, launch_steps
from comm2perfetto.sources.read import load_sources
from comm2perfetto.trace.check import check_trace
from support.cli import run_cli
from support.factories import T0_NS, steady_job
from support.kineto_fixtures import COMPUTE_STREAM, NCCL_STREAM, TP_GROUP, TS0, KinetoDoc, write_trace_job

# --- ranks -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, rank", [
    ("rank-3.json", 3), ("rank3.pt.trace.json.gz", 3), ("rank_3.json", 3), ("trace_rank_12.json.gz", 12),
    ("rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz", 0), ("sampled_rank-1.json.gz", 1),
    ("rank0_iter16_18.json", 0), ("rank0.kineto.1.json.gz", 0),
    ("train_resnet18.json.gz", None), ("worker7.json", None), ("myrank3.json", None), ("ranked.json", None),
])
def test_rank_from_explicit_name_patterns_only(name, rank):
    assert rank_from_trace_name(name) == rank


@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_distributed_info_is_found_anywhere_in_the_file(tmp_path, suffix):
    """Rewritten traces put distributedInfo after the events (a real one: 863,585 bytes in)."""
    doc = KinetoDoc(rank=5, world_size=8)
    main_tid = doc.thread(doc.pid, "python")
    for i in range(20_000):  # about 2.5 MB of events before the key
        doc.cpu(main_tid, f"aten::op_{i % 50}", i * 2.0, 1.0, extra={"rank": 99})
    document = doc.document()
    info = document.pop("distributedInfo")
    raw = orjson.dumps({**document, "distributedInfo": info})
    assert raw.index(b'"distributedInfo"') > 2 << 20
    path = tmp_path / f"trace{suffix}"
    path.write_bytes(gzip.compress(raw) if suffix.endswith(".gz") else raw)
    assert distributed_info(path, gzipped=suffix.endswith(".gz")) == (5, 8)
    assert set(load_sources([path]).kineto) == {5}


def test_a_trace_of_unknown_rank_is_named_and_its_rank_can_be_given(tmp_path):
    doc = KinetoDoc()
    doc.thread(doc.pid, "python")
    doc.cpu(doc.pid, "aten::mm", 0.0, 5.0)
    document = doc.document()
    del document["distributedInfo"]
    path = tmp_path / "worker.json"
    path.write_bytes(orjson.dumps(document))
    code, _out, err = run_cli("diagnose", str(tmp_path))
    assert code == 2
    assert f"--trace-rank {path}=RANK" in err and len(err.strip().splitlines()) == 1
    src = load_sources([tmp_path], LoadOptions(trace_ranks={"worker.json": 3}))
    assert set(src.kineto) == {3} and src.traces[3][0].path == path
    code, out, _err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"),
                              "--trace-rank", f"{path}=3")
    assert code == 0 and "ranks: 1 of" in out
    assert run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"), "--trace-rank", "x.json")[0] == 2


# --- collectives, alignment, stragglers --------------------------------------------------------------------


@pytest.mark.parametrize("seq", [True, False])
def test_traces_alone_make_a_job_aligned_on_kernel_ends(tmp_path, seq):
    world = 4
    tj = write_trace_job(tmp_path, world=world, collectives=6, seq=seq)
    job = load_job([tmp_path])
    assert job.world_size == world and sorted(job.ranks) == list(range(world))
    (uid, cols), = job.collectives.items()
    assert job.groups[uid].ranks_source == "profiler" and job.groups[uid].label == "default_pg"
    assert [c.seq for c in cols] == list(range(1, 7)) and all(c.op == "all_reduce" for c in cols)
    # Each rank's clock runs offsets_ns[r] ahead: aligning on the kernels' simultaneous ends undoes it exactly.
    assert dict(job.clock.offset_ns) == {r: -tj.offsets_ns[r] for r in range(world)}
    assert job.clock.residual_skew_ns == 0
    for c, true_end in zip(cols, tj.ends_ns):
        assert set(c.end_ns) == {true_end}
        assert set(c.sources) == {"kineto"} and set(c.states) == {"completed"}
        # the late rank issued it last (record_param_comms' begin, on the aligned clock)
        assert max(c.ranks, key=lambda r: c.arrive_ns[c.ranks.index(r)]) == tj.late_rank


def test_traces_alone_merge_and_diagnose(tmp_path):
    write_trace_job(tmp_path / "t", world=3, collectives=6)
    out_path = tmp_path / "job.pftrace"
    code, out, _err = run_cli("merge", str(tmp_path / "t"), "-o", str(out_path))
    assert code == 0, out
    assert "ranks: 3 of 3; collectives: 6" in out and "residual skew 0 s (12 collective ends)" in out
    trace = check_trace(out_path)
    names = {t.name for t in trace.tracks.values()}
    assert {"default_pg", "steps", "steps (GPU)", f"GPU 0 stream {NCCL_STREAM}"} <= names
    flows = [evs for evs in trace.flows.values() if all(e.name == "all_reduce" for e in evs)]
    assert len(flows) == 6 and all(len(evs) == 3 for evs in flows)
    steps = [e for e in trace.events if trace.tracks[e.track].name == "steps"]
    assert {e.name for e in steps} == {f"step {n}" for n in range(5, 11)}
    code, out, _err = run_cli("diagnose", str(tmp_path / "t"))
    assert code == 0 and out.startswith("OK")
    code, out, _err = run_cli("report", str(tmp_path / "t"), "--format", "json")
    (row,) = orjson.loads(out)["collectives"]
    assert (row["op"], row["count"], row["timed"]) == ("all_reduce", 6, 6)
    (straggler, *_) = orjson.loads(out)["stragglers"]
    assert straggler["rank"] == 1  # write_trace_job's late rank
    assert orjson.loads(out)["modules"] == []  # a trace does not say which module, nor whether C++ issued it


def test_trace_collectives_join_flight_recorder_entries_by_seq(tmp_path):
    """FR knows the collective (signature, stack); the trace gives the kernel's GPU begin and end."""
    fr = steady_job(world=2, steps=3)
    fr.write(tmp_path / "fr")
    tj = write_trace_job(tmp_path / "traces", world=2, collectives=3, offsets_ns={0: 0, 1: 0},
                         start_ns=T0_NS - 2_000_000)
    job = load_job([tmp_path])
    cols = job.collectives["0[0,1]"]
    joined = [c for c in cols if "fr+kineto" in c.sources]
    assert [c.seq for c in joined] == [1, 2, 3]
    for c, true_end in zip(joined, tj.ends_ns):
        assert set(c.end_ns) == {true_end}
        assert c.signatures[0].source == "fr"


@pytest.mark.parametrize("fr_ranks", [(0, 1), (0,)])
def test_order_numbered_traces_are_not_joined_to_flight_recorder(tmp_path, fr_ranks):
    """Not on the ranks with dumps, and not on the others either: their numbers would collide with FR's."""
    fr = steady_job(world=2, steps=3)
    fr.write(tmp_path / "fr")
    for rank in set(fr.ranks) - set(fr_ranks):
        for path in (tmp_path / "fr").iterdir():
            if path.name.endswith(str(rank)):
                path.unlink()
    write_trace_job(tmp_path / "traces", world=2, collectives=3, seq=False, offsets_ns={0: 0, 1: 0},
                    start_ns=T0_NS - 2_000_000)
    job = load_job([tmp_path])
    assert not any(s and "kineto" in s for c in job.iter_collectives() for s in c.sources)
    assert any("without sequence numbers (Seq) were not joined" in n for n in job.notes)


def test_collectives_of_a_2023_trace_and_p2p_and_wait_records():
    doc = KinetoDoc(more_groups=[TP_GROUP])
    main_tid = doc.thread(doc.pid, "python")
    rpc = doc.cpu(main_tid, "record_param_comms", 0.0, 10.0)  # 2023: ids only
    doc.gpu(NCCL_STREAM, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", 20.0,
            30.0, extra={"External id": rpc["args"]["External id"]})
    doc.gpu(NCCL_STREAM, "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*)", 60.0, 5.0)
    doc.cpu(main_tid, "record_param_comms", 70.0, 1.0, extra={"Collective name": "wait", "Seq": 4})
    trace = read_kineto("x", orjson.dumps(doc.document()))
    (c,) = collectives_of([trace])
    assert (c.op, c.pg_name, c.seq, c.on_gpu, c.only_group) == ("all_reduce", None, None, True, False)
    doc.more_groups = []  # the trace lists one group: a kernel naming none is that group's
    (c,) = collectives_of([read_kineto("x", orjson.dumps(doc.document()))])
    assert (c.op, c.pg_name, c.pg_desc, c.pg_ranks, c.only_group) == ("all_reduce", "0", "default_pg", (0, 1), True)
    assert op_name("_allgather_base", None) == "_allgather_base" and op_name(None, "sm90_gemm") == "collective"


def _batch(doc: KinetoDoc, tid: int, t0: float, kernel_id: bool = False) -> None:
    """One batch_isend_irecv as recent torch traces it: c10d::send, c10d::recv_, then the nccl:coalesced
    annotation inside which the SendRecv kernel is launched; the kernel has no External id (unless
    ``kernel_id``), the annotation's copy on the stream has the annotation's."""
    doc.cpu(tid, "c10d::send", t0, 40.0)
    doc.cpu(tid, "c10d::recv_", t0 + 50.0, 20.0)
    annotation = doc.cpu(tid, "nccl:coalesced", t0 + 80.0, 50.0, cat="user_annotation")
    kernel = doc.gpu(NCCL_STREAM, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", t0 + 120.0, 3.0)
    if not kernel_id:
        del kernel["args"]["External id"]
    doc.gpu(NCCL_STREAM, "nccl:coalesced", t0 + 120.0, 3.0, cat="gpu_user_annotation",
            extra={"External id": annotation["args"]["External id"]})


def test_send_recv_kernels_are_joined_to_their_batches_by_order_where_no_id_ties_them():
    doc = KinetoDoc()
    main_tid = doc.thread(doc.pid, "python")
    for k in range(3):
        _batch(doc, main_tid, 1000.0 * k)
    trace = read_kineto("x", orjson.dumps(doc.document()))
    batches = p2p_batches([trace])
    us = [round((b.issued_ns - trace.base_time_ns) / 1000 - TS0) for b in batches]
    assert us == [0, 1000, 2000]  # from the batch's first c10d::send
    assert [(b.call_end_ns - b.issued_ns, b.t_end_ns - b.t_begin_ns) for b in batches] == [(130_000, 3_000)] * 3
    assert batches[0].holds(batches[0].issued_ns + 60_000) and not batches[0].holds(batches[1].issued_ns)
    # a kernel more than the annotations (one of a batch before the profiler started): by order, no guess
    doc.gpu(NCCL_STREAM, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", -500.0, 3.0)
    del doc.events[-1]["args"]["External id"]
    assert p2p_batches([read_kineto("x", orjson.dumps(doc.document()))]) == []
    # a kernel whose External id ties it to its annotation is joined by it, whatever the others' count
    _batch(doc, main_tid, 3000.0, kernel_id=True)
    doc.events[-2]["args"]["External id"] = doc.events[-3]["args"]["External id"]  # the kernel -> annotation
    (batch,) = p2p_batches([read_kineto("x", orjson.dumps(doc.document()))])
    assert round((batch.t_begin_ns - doc.base_ns) / 1000 - TS0) == 3120


# --- mixed jobs, merge output ------------------------------------------------------------------------------


def test_a_trace_from_another_year_is_not_this_jobs(tmp_path):
    steady_job(world=2, steps=3).write(tmp_path / "fr")
    write_trace_job(tmp_path / "old", world=2, collectives=2, start_ns=T0_NS - 400 * 86_400 * 10**9)
    with pytest.raises(MixedJobsError, match="days away from the Flight Recorder dumps"):
        load_sources([tmp_path])
    code, _out, err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"))
    assert code == 2 and "more than one job" in err
    code, _out, err = run_cli("report", str(tmp_path))  # report reads the traces its own way: same check
    assert code == 2 and "days away from the Flight Recorder dumps" in err
    assert len(load_sources([tmp_path], LoadOptions(force=True)).traces) == 2


def test_a_trace_of_another_world_size_is_not_this_jobs(tmp_path):
    steady_job(world=2, steps=3).write(tmp_path / "fr")
    write_trace_job(tmp_path / "big", world=3, collectives=2, start_ns=T0_NS)
    with pytest.raises(MixedJobsError, match="world size 3, the dumps and logs from one of 2"):
        load_sources([tmp_path])


@pytest.mark.parametrize("suffix", [".json", ".json.gz", ".pftrace"])
def test_merge_writes_profiled_steps_long_before_the_first_fr_entry(tmp_path, suffix):
    """A long job's FR ring keeps only the last collectives; the profiler ran 10 minutes earlier."""
    steady_job(world=2, steps=3).write(tmp_path / "fr")
    write_trace_job(tmp_path / "traces", world=2, collectives=2, start_ns=T0_NS - 600 * 10**9)
    out_path = tmp_path / f"job{suffix}"
    code, out, _err = run_cli("merge", str(tmp_path), "-o", str(out_path))
    assert code == 0, out
    trace = check_trace(out_path)
    assert any(e.name == "ncclDevKernel_AllReduce_Sum_f32_RING_LL" for e in trace.events)


@pytest.mark.parametrize("command", ["merge", "report"])
def test_no_profiler_on_traces_alone_is_a_one_line_error(tmp_path, command):
    write_trace_job(tmp_path / "t", world=2, collectives=2)
    extra = ["-o", str(tmp_path / "j.pftrace")] if command == "merge" else []
    code, _out, err = run_cli(command, str(tmp_path / "t"), *extra, "--no-profiler")
    assert code == 2 and "only profiler traces found" in err and len(err.strip().splitlines()) == 1


def test_no_profiler_leaves_traces_out_of_the_job(tmp_path):
    steady_job(world=2, steps=3).write(tmp_path / "fr")
    write_trace_job(tmp_path / "traces", world=2, collectives=2, start_ns=T0_NS)
    assert load_job([tmp_path], LoadOptions(traces=Traces.NONE)).traces == {}
    code, _out, _err = run_cli("merge", str(tmp_path), "-o", str(tmp_path / "j.pftrace"), "--no-profiler")
    assert code == 0
    assert not any(t.name and t.name.startswith("GPU") for t in check_trace(tmp_path / "j.pftrace").tracks.values())


# --- kernel classes, steps on the GPU ----------------------------------------------------------------------


@pytest.mark.parametrize("name, family, hta_comm", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "nccl", True),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "nccl", True),  # RCCL on MI300
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 8, 16>(...)", "symmetric memory",
     False),
    ("c10d::symmetric_memory::two_shot_all_reduce_kernel<float>", "symmetric memory", False),
    ("nvshmemi_alltoall_kernel", "nvshmem", False),
    ("oneccl_allreduce_kernel", "oneccl", False),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", None, False),
])
def test_communication_kernel_table(name, family, hta_comm):
    assert comm_family(name) == family
    assert classify_gpu(name, "kernel") == ("comm" if family else "compute")
    assert classify_gpu(name, "kernel", hta=True) == ("comm" if hta_comm else "compute")


def test_a_kernel_belongs_to_the_step_that_launched_it():
    steps = [(5, 0, 100), (6, 100, 200), (7, 200, 300)]
    # launched at 90 (step 5) but run at 150-190; launched at 150, run 190-260; no launch known: by begin
    launched = launch_steps(steps, {1: 90, 2: 150}, [(1, 150), (2, 190), (None, 250), (3, 400)])
    assert launched == [5, 6, 7, None]
    spans = gpu_step_spans(steps, launched, [(150, 190), (190, 260), (250, 320), (400, 410)])
    assert spans == ((5, 150, 190), (6, 190, 250), (7, 250, 320))


def test_report_steps_follow_the_gpu(tmp_path):
    """Every kernel of a step runs after its CPU span ended: CPU windows would keep none of the comm."""
    doc = KinetoDoc()
    main_tid = doc.thread(doc.pid, "python")
    comm_us = 0.0
    for k in range(3):
        t0 = k * 1000.0
        doc.cpu(main_tid, f"ProfilerStep#{k + 1}", t0, 100.0, cat="user_annotation")
        launch = doc.cpu(main_tid, "cudaLaunchKernel", t0 + 50.0, 5.0, cat="cuda_runtime", correlation=k + 1)
        compute = doc.cpu(main_tid, "cudaLaunchKernel", t0 + 60.0, 5.0, cat="cuda_runtime", correlation=k + 101)
        doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 400.0, 200.0,
                extra={"correlation": launch["args"]["correlation"]})
        doc.gpu(COMPUTE_STREAM, "sm90_gemm", t0 + 300.0, 200.0, extra={"correlation": compute["args"]["correlation"]})
        comm_us += 200.0
    doc.write(tmp_path / "rank0.json")
    code, out, _err = run_cli("report", str(tmp_path), "--steps", "1-3", "--format", "json")
    assert code == 0
    report = orjson.loads(out)
    assert report["ranks"]["0"]["comm_s"] == pytest.approx(comm_us * 1e-6)
    assert report["ranks"]["0"]["overlap_pct"] == pytest.approx(100 * 100.0 / 200.0)
    assert [row["step"] for row in report["steps"]] == [1, 2, 3]
    assert report["steps"][0]["job"]["comm_s"] == pytest.approx(200e-6)


def test_hta_scope_drops_the_last_step_and_kernels_outside_steps(tmp_path):
    doc = KinetoDoc()
    main_tid = doc.thread(doc.pid, "python")
    for k in range(3):
        t0 = k * 1000.0
        doc.cpu(main_tid, f"ProfilerStep#{k + 1}", t0, 900.0, cat="user_annotation")
        launch = doc.cpu(main_tid, "cudaLaunchKernel", t0 + 10.0, 5.0, cat="cuda_runtime", correlation=k + 1)
        doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", t0 + 100.0, 100.0,
                extra={"correlation": launch["args"]["correlation"]})
        # symmetric memory: comm for report, compute for HTA
        doc.gpu(COMPUTE_STREAM, "multimem_all_reduce_kernel", t0 + 150.0, 100.0,
                extra={"correlation": launch["args"]["correlation"]})
    doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 5000.0, 100.0)  # launched outside steps
    doc.write(tmp_path / "rank0.json")
    code, out, _err = run_cli("report", str(tmp_path), "--format", "json")
    assert code == 0
    whole = orjson.loads(out)["ranks"]["0"]
    assert whole["comm_s"] == pytest.approx((3 * 150 + 100) * 1e-6) and whole["overlap_pct"] == 0
    code, out, _err = run_cli("report", str(tmp_path), "--format", "json", "--hta-scope")
    assert code == 0
    hta = orjson.loads(out)
    assert hta["ranks"]["0"]["comm_s"] == pytest.approx(2 * 100 * 1e-6)
    assert hta["ranks"]["0"]["overlap_pct"] == pytest.approx(50.0)
    assert any("--hta-scope" in n for n in hta["notes"])


def test_a_folder_of_nothing_but_an_unreadable_trace(tmp_path):
    (tmp_path / "rank0.json").write_text('{"traceEvents": [ broken')
    with pytest.raises(SourceError, match=r"rank0\.json"):
        load_sources([tmp_path])


def test_hta_scope_matches_hta_on_its_own_public_trace(tmp_path):
    """HTA 0.5.0, ``TraceAnalysis(trace_dir).get_comm_comp_overlap()`` on this file: 14.31 (its two decimals).
    The exact overlap of every kernel, to the nanosecond, is higher: HTA leaves the last step's kernels out and
    rounds every kernel inward to whole microseconds."""
    data = Path(__file__).parents[1] / "data" / "kineto" / "hta_nccl_data.json.gz"
    code, out, _err = run_cli("report", str(data), "--format", "json", "--hta-scope")
    assert code == 0
    assert round(orjson.loads(out)["ranks"]["0"]["overlap_pct"], 2) == 14.31
    code, out, _err = run_cli("report", str(data), "--format", "json")
    exact = orjson.loads(out)["ranks"]["0"]["overlap_pct"]
    assert exact - 14.31 > 0.8  # the difference docs/report.md warns about


def test_a_public_real_trace_alone_is_a_job(tmp_path):
    """The trace's 21 NCCL kernels (15 all-reduces, 6 broadcasts) each launched by a record_param_comms naming
    default_pg with ranks [0, 1]; only rank 0's file is there."""
    data = Path(__file__).parents[1] / "data" / "kineto" / "hta_nccl_data.json.gz"
    job = load_job([data])
    (uid, cols), = job.collectives.items()
    assert job.groups[uid].ranks == (0, 1) and job.world_size == 2
    assert sorted(c.op for c in cols) == ["all_reduce"] * 15 + ["broadcast"] * 6
    code, out, _err = run_cli("merge", str(data), "-o", str(tmp_path / "job.json.gz"))
    assert code == 0 and "collectives: 21;" in out
    check_trace(tmp_path / "job.json.gz")


def test_symmetric_memory_kernels_are_communication_on_a_public_b200_trace():
    data = Path(__file__).parents[1] / "data" / "kineto" / "tracelens_b200_eager_trace.json.gz"
    events = orjson.loads(gzip.decompress(data.read_bytes()))["traceEvents"]
    multimem = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("cat") == "kernel" and "multimem_all_reduce_kernel" in e["name"])
    assert len(multimem) > 50 and all(comm_family(e["name"]) == "symmetric memory" for e in events
                                      if e.get("cat") == "kernel" and "multimem" in e["name"])
    covered, end = 0.0, float("-inf")  # their union, in us
    for b, e in multimem:
        covered += max(0.0, e - max(b, end))
        end = max(end, e)
    code, out, _err = run_cli("report", str(data), "--format", "json")
    comm_s = orjson.loads(out)["ranks"]["0"]["comm_s"]
    assert code == 0 and comm_s >= covered * 1e-6 * 0.999
    # HTA's classes (no steps in this trace: HTA's scope keeps every kernel): only the one NCCL all-gather
    code, out, _err = run_cli("report", str(data), "--format", "json", "--hta-scope")
    assert orjson.loads(out)["ranks"]["0"]["comm_s"] < covered * 1e-6 / 10


def test_traces_without_seq_that_cover_different_steps_meet_in_the_steps_they_share(tmp_path):
    """Rank 1's profiler started a step later: numbered by (step, place in the step), its collectives still
    meet rank 0's of the same step (by bare order they would all be one off)."""
    tj = write_trace_job(tmp_path, world=2, collectives=7, seq=False)
    rank1 = tj.paths[1]
    doc = orjson.loads(rank1.read_bytes())
    first_step = next(e for e in doc["traceEvents"] if e.get("name") == "ProfilerStep#5")
    end = first_step["ts"] + first_step["dur"]
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not (isinstance(e.get("ts"), float) and e["ts"] < end
                                                               and e.get("ph") == "X")]
    rank1.write_bytes(orjson.dumps(doc))
    job = load_job([tmp_path])
    cols = next(iter(job.collectives.values()))
    assert [c.joined_ranks for c in cols] == [(0,)] + [(0, 1)] * 6
    assert dict(job.clock.offset_ns) == {0: 0, 1: -tj.offsets_ns[1]}  # aligned on the six shared ends
    for c, true_end in zip(cols[1:], tj.ends_ns[1:]):
        assert set(c.end_ns) == {true_end}


def test_kernels_of_no_group_are_explained_by_what_the_trace_shows(tmp_path):
    """The note said "torch before 2.2 wrote none" of any collective without a process group, also of a recent
    trace whose kernels' launching op is not in it. It now says which: a kernel no record_param_comms is tied
    to, or one whose record_param_comms names no group either."""
    doc = KinetoDoc(rank=0, world_size=2, more_groups=[TP_GROUP])  # several groups: the kernels are no one's
    main_tid = doc.thread(doc.pid, "python")
    doc.cpu(main_tid, "ProfilerStep#1", 0.0, 900.0, cat="user_annotation")
    # launched before the profiler started: the kernel alone, its args naming no group
    doc.gpu(NCCL_STREAM, "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 10.0, 50.0)
    # a 2023-style pair: tied by External id, neither naming a group
    rpc = doc.cpu(main_tid, "record_param_comms", 100.0, 20.0)
    doc.gpu(NCCL_STREAM, "ncclDevKernel_AllGather_RING_LL", 150.0, 50.0,
            extra={"External id": rpc["args"]["External id"]})
    doc.write(tmp_path / "rank0.json")
    job = load_job([tmp_path])
    (note,) = [n for n in job.notes if "name no process group" in n]
    assert note.startswith("2 collective(s) of profiler traces name no process group")
    assert "1 tied to no record_param_comms of the trace by External id" in note
    assert "1 whose record_param_comms names none either" in note
    assert "torch before" not in note


# --- per-group Seq on record_param_comms and on NCCL kernels (pytorch PR 177148, kineto PRs 1294/1296) ----------


def _with_seq(events: list[dict], first: int) -> list[tuple[str, int, int]]:
    """Number the trace's collectives from ``first`` as newer torch does, with ``Seq`` on each NCCL kernel, and
    leave out the record_param_comms that launched them; returns each (op, nelems, seq) in issue order."""
    ops = {"allreduce": "all_reduce", "broadcast": "broadcast"}
    launchers = {e["args"]["External id"]: e for e in events if e.get("name") == "record_param_comms"}
    kernels = sorted((e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                     key=lambda e: launchers[e["args"]["External id"]]["ts"])
    out = []
    for seq, k in enumerate(kernels, first):
        k["args"]["Seq"] = seq
        launchers[k["args"]["External id"]]["name"] = "other_op"
        out.append((ops[k["args"]["Collective name"]], k["args"]["In msg nelems"], seq))
    return out


def test_a_real_trace_with_seq_joins_flight_recorder_by_group_and_seq(tmp_path):
    """HTA's public NCCL trace (rank 0 of 2) with the Seq newer torch writes, its window starting at collective
    101 of a job whose dumps hold 130, and its record_param_comms left out (the window opened after they ran):
    each kernel joins the entry of its own group and seq, not the first in order. (With the CPU ops there, the
    same join is test_trace_collectives_join_flight_recorder_entries_by_seq's.)"""
    data = Path(__file__).parents[1] / "data" / "kineto" / "hta_nccl_data.json.gz"
    doc = orjson.loads(gzip.decompress(data.read_bytes()))
    numbered = _with_seq(doc["traceEvents"], 101)
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "rank0.json").write_bytes(orjson.dumps(doc))
    fr = steady_job(world=2, steps=0)
    by_seq = {seq: (op, n) for op, n, seq in numbered}
    t0 = doc["baseTimeNanoseconds"] + round(min(e["ts"] for e in doc["traceEvents"] if "ts" in e) * 1000)
    for seq in range(1, 131):
        op, n = by_seq.get(seq, ("all_reduce", 8))
        for r in fr.ranks:
            fr.collective(r, op, [[n]], t_ns=t0 + (seq - 101) * 1_000_000)
    fr.write(tmp_path / "fr")
    job = load_job([tmp_path])
    cols = {c.seq: c for c in job.collectives["0[0,1]"]}
    assert len(cols) == 130  # the trace's collectives are the dumps', not 21 more
    joined = sorted(seq for seq, c in cols.items() if "fr+kineto" in c.sources)
    assert joined == [seq for _, _, seq in numbered]
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and "Seq" in e["args"]]
    for k in kernels:
        c = cols[k["args"]["Seq"]]
        assert c.signatures[0].op == by_seq[k["args"]["Seq"]][0]
        assert c.duration_ns[c.ranks.index(0)] == round(k["dur"] * 1000)  # its own kernel's time, not a neighbour's
    assert not any("were not joined" in n for n in job.notes)
