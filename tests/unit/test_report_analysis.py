"""The analyses behind ``comm2perfetto report``: interval arithmetic, the compute/comm breakdown on GPU kernels
(HTA's overlap, values derived by hand), bandwidth, stragglers and the per-module table.

Expected values are written as their derivation from the inputs, so a reader can check them.
"""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from comm2perfetto import group_columns
from comm2perfetto.group_columns import GroupCollectives
from comm2perfetto.intervals import Measured, difference, envelope, intersection, length, union
from comm2perfetto.match import load_job
from comm2perfetto.model import Signature
from comm2perfetto.report.activity import RankActivity, rank_activity
from comm2perfetto.report.bandwidth import bus_factor, collective_table, message_bytes, percentile
from comm2perfetto.report.document import _profiled_note, _RankFacts, build_report, steps_text
from comm2perfetto.report.modules import NOT_SEEN, OUTSIDE, module_table
from comm2perfetto.report.overlap import breakdown, job_breakdown
from comm2perfetto.report.stragglers import lateness_map, straggler_table
from comm2perfetto.report_doc import Basis
from comm2perfetto.sources.kineto.profile import kineto_intervals
from support.factories import T0_NS, EventLog, FrJob, steady_job
from support.kineto_fixtures import KinetoDoc

# --- intervals ---------------------------------------------------------------------------------------------


def _covered(spans) -> set[int]:
    return {t for b, e in spans for t in range(b, e)}


@pytest.mark.parametrize("seed", range(20))
def test_interval_algebra_matches_point_sets(seed):
    rnd = random.Random(seed)

    def spans():
        out = []
        for _ in range(rnd.randint(0, 12)):
            b = rnd.randint(0, 200)
            out.append((b, b + rnd.randint(-3, 40)))  # some empty or reversed: dropped
        return out

    raw_a, raw_b = spans(), spans()
    a, b = union(raw_a), union(raw_b)
    assert _covered(a) == _covered(raw_a) and _covered(b) == _covered(raw_b)
    assert all(x[1] < y[0] for x, y in itertools.pairwise(a)), "a union is disjoint, ordered, touching spans merged"
    assert _covered(intersection(a, b)) == _covered(a) & _covered(b)
    assert _covered(difference(a, b)) == _covered(a) - _covered(b)
    assert length(intersection(a, b)) == len(_covered(a) & _covered(b))
    measured = Measured(a)
    for _ in range(20):
        lo = rnd.randint(-10, 250)
        hi = lo + rnd.randint(-5, 120)
        assert measured.within(lo, hi) == len({t for t in _covered(a) if lo <= t < hi}), (lo, hi)


def test_union_merges_touching_and_nested_spans():
    assert union([(30, 40), (0, 10), (10, 20), (2, 5), (40, 40)]) == [(0, 20), (30, 40)]
    assert envelope([(5, 9)], [], [(1, 3)]) == (1, 9)
    assert envelope([], []) is None


# --- GPU kernels: HTA's overlap, derived by hand -------------------------------------------------------------

COMPUTE_KERNEL = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float> >"
GEMM = "ampere_sgemm_128x64_tn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _gpu_rank(tmp_path, rank: int, comm_shift: float = 0.0):
    """Kernels (times in us from the trace's start):

    compute, stream 7:  [0, 100]  [150, 250]      compute, stream 8: [90, 160] (across both: union [0, 250])
    comm, stream 13:    [80, 180] [260, 300]      (+ comm_shift)
    memory, stream 7:   Memcpy [330, 340]
    """
    doc = KinetoDoc(rank=rank, world_size=2)
    main = doc.thread(doc.pid, "python")
    doc.cpu(main, "ProfilerStep#4", 0.0, 340.0, cat="user_annotation")
    doc.gpu(7, COMPUTE_KERNEL, 0.0, 100.0)
    doc.gpu(7, GEMM, 150.0, 100.0)
    doc.gpu(8, GEMM, 90.0, 70.0)
    doc.gpu(13, NCCL, 80.0 + comm_shift, 100.0)
    doc.gpu(13, NCCL, 260.0 + comm_shift, 40.0)
    doc.gpu(7, "Memcpy HtoD (Pageable -> Device)", 330.0, 10.0, cat="gpu_memcpy")
    return doc.write(tmp_path / f"rank{rank}.pt.trace.json.gz")


def test_gpu_breakdown_is_htas_overlap(tmp_path):
    profile = kineto_intervals([_gpu_rank(tmp_path, 0)])
    a = rank_activity(None, 0, profile)
    assert a.basis == Basis.GPU
    b = breakdown(a)
    us = 1000
    assert b.compute_ns == 250 * us                       # union [0, 250]
    assert b.comm_ns == (100 + 40) * us                   # [80, 180] + [260, 300]
    assert b.overlapped_ns == 100 * us                    # [80, 180] lies inside [0, 250]
    assert b.exposed_ns == 40 * us                        # [260, 300]
    assert b.span_ns == 340 * us                          # first kernel start to the Memcpy's end
    assert b.idle_ns == (340 - 250 - 40 - 10) * us        # gaps [250, 260] and [300, 330]
    assert b.overlap_pct == pytest.approx(100 * 100 / 140)
    assert b.comm_to_compute == pytest.approx(140 / 250)


def test_gpu_breakdown_of_a_rank_whose_comm_runs_late(tmp_path):
    """Rank 1's NCCL kernels start 100 us later: [180, 280] overlaps [180, 250] only; [360, 400] is exposed."""
    a = rank_activity(None, 1, kineto_intervals([_gpu_rank(tmp_path, 1, comm_shift=100.0)]))
    b = breakdown(a)
    assert b.overlapped_ns == (250 - 180) * 1000
    assert b.overlap_pct == pytest.approx(100 * 70 / 140)
    assert b.span_ns == 400 * 1000


def _fractional_rank(tmp_path):
    """Kernels on Kineto's nanosecond grid (us from the trace's start):

    compute, stream 7:  [0.4, 10.6]  [12.2, 20.9]  [30.1, 30.8]
    comm, stream 13:    [5.5, 25.5]
    """
    doc = KinetoDoc(rank=0, world_size=1)
    doc.gpu(7, GEMM, 0.4, 10.2)
    doc.gpu(7, GEMM, 12.2, 8.7)
    doc.gpu(7, COMPUTE_KERNEL, 30.1, 0.7)
    doc.gpu(13, NCCL, 5.5, 20.0)
    return doc.write(tmp_path / "rank0.pt.trace.json")


def test_hta_rounding_reads_kernels_as_hta_does(tmp_path):
    path = _fractional_rank(tmp_path)
    exact = breakdown(rank_activity(None, 0, kineto_intervals([path])))
    assert exact.comm_ns == 20_000                                # [5.5, 25.5]
    assert exact.overlapped_ns == (10_600 - 5_500) + (20_900 - 12_200)
    assert exact.overlap_pct == pytest.approx(100 * 13.8 / 20)
    # Inward to whole microseconds: [1, 10] [13, 20], [31, 30] is gone; comm [6, 25].
    hta = breakdown(rank_activity(None, 0, kineto_intervals([path], whole_us=True)))
    assert hta.compute_ns == (9 + 7) * 1000
    assert hta.comm_ns == 19_000
    assert hta.overlapped_ns == ((10 - 6) + (20 - 13)) * 1000
    assert hta.overlap_pct == pytest.approx(100 * 11 / 19)


def test_job_row_means_times_and_takes_ratios_from_totals(tmp_path):
    parts = [breakdown(rank_activity(None, r, kineto_intervals([_gpu_rank(tmp_path, r, comm_shift=100.0 * r)])))
             for r in (0, 1)]
    row = job_breakdown(parts)
    assert row["ranks"] == 2
    assert row["comm_s"] == pytest.approx(140e-6)                      # both ranks 140 us
    assert row["overlapped_comm_s"] == pytest.approx((100 + 70) / 2 * 1e-6)
    assert row["overlap_pct"] == pytest.approx(100 * (100 + 70) / (140 + 140))
    assert row["span_s"] == pytest.approx((340 + 400) / 2 * 1e-6)


def test_steps_of_a_profile_window_the_breakdown(tmp_path):
    doc = build_report(None, {0: kineto_intervals([_gpu_rank(tmp_path, 0)])})
    assert [s["step"] for s in doc["steps"]] == [4]
    assert doc["steps"][0]["ranks"]["0"]["overlap_pct"] == pytest.approx(100 * 100 / 140)
    assert doc["basis"] == "gpu"
    assert doc["ranks"]["0"]["sources"] == ["profiler GPU kernels"]


def test_breakdown_in_a_window_clips_every_union():
    a = RankActivity(0, "cpu", (), compute=[(0, 100)], comm=[(50, 150)], memory=[], steps=())
    b = breakdown(a, (75, 125))
    assert (b.span_ns, b.compute_ns, b.comm_ns, b.overlapped_ns, b.idle_ns) == (50, 25, 50, 25, 0)


# --- CPU basis from a recorder log ----------------------------------------------------------------------------


def test_cpu_basis_never_counts_a_blocked_thread_as_compute(tmp_path):
    """A user range wraps a whole step; inside it a blocking all_reduce waits 30 ms: that is comm, not compute.
    An async all_reduce is issued in 1 ms (comm, not compute: the thread is inside the call) and completes while
    the range computes: overlapped."""
    ms = 1_000_000
    log = EventLog(rank=0, world=1)
    log.group(0, "0", "default_pg", [0])
    log.step(1, T0_NS)
    log.range("step", T0_NS, T0_NS + 100 * ms)
    log.call("all_reduce", T0_NS + 40 * ms, seq=1, dur_ns=30 * ms, shapes=[[4]], dtypes=["Float"], nbytes=16)
    log.call("all_reduce", T0_NS + 80 * ms, seq=2, dur_ns=1 * ms, is_async=True, done_ns=T0_NS + 90 * ms,
             shapes=[[4]], dtypes=["Float"], nbytes=16)
    log.close(T0_NS + 101 * ms)
    log.write(tmp_path)
    job = load_job([tmp_path])
    a = rank_activity(job, 0, None)
    b = breakdown(a)
    assert a.basis == "cpu" and "recorder ranges" in a.sources
    assert b.compute_ns == (100 - 30 - 1) * ms        # the range minus both calls, call to return
    assert b.comm_ns == (30 + 10) * ms                # blocking call, and the async one from call to completion
    assert b.overlapped_ns == (10 - 1) * ms           # the async one after its return, while the range computes
    assert b.exposed_ns == (30 + 1) * ms


# --- bandwidth ------------------------------------------------------------------------------------------------


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("allgather_into_tensor_coalesced", 8) == pytest.approx(7 / 8)
    assert bus_factor("_reduce_scatter_base", 4) == pytest.approx(3 / 4)
    assert bus_factor("all_to_all_single", 2) == pytest.approx(1 / 2)
    assert bus_factor("broadcast", 8) == bus_factor("reduce", 8) == 1.0
    assert bus_factor("barrier", 8) is None


def test_message_size_is_what_nccl_tests_calls_s():
    ar = Signature("all_reduce", ((1024, 1024),), ("Float",), ((1024, 1024),), ("Float",))
    ag = Signature("_allgather_base", ((256,),), ("BFloat16",), ((1024,),), ("BFloat16",))
    ag_log = Signature("all_gather_into_tensor", ((256,),), ("BFloat16",), None, None, source="log")
    rs = Signature("_reduce_scatter_base", ((1024,),), ("Float",), ((256,),), ("Float",))
    assert message_bytes(ar, 4) == 1024 * 1024 * 4       # each rank's buffer
    assert message_bytes(ag, 4) == 1024 * 2              # the gathered buffer
    assert message_bytes(ag_log, 4) == 4 * 256 * 2       # outputs unknown: n x input
    assert message_bytes(rs, 4) == 1024 * 4              # the buffer before scattering


def test_percentile_is_nearest_rank():
    assert percentile(list(range(1, 101)), 50) == 50
    assert percentile([3, 9], 99) == 9


def _staggered_job(tmp_path, world=4, steps=5, lag_ns=10_000):
    """All-reduces of 1 MiB floats on gloo, called synchronously from Python; rank r arrives r * lag after rank
    0, and every rank returns 50 us after the last one arrived (returning is completing on a CPU backend)."""
    for r in range(world):
        log = EventLog(rank=r, world=world)
        log.group(0, "0", "default_pg", list(range(world)))
        for i in range(steps):
            log.call("all_reduce", T0_NS + i * 1_000_000 + r * lag_ns, seq=i + 1, shapes=[[512, 512]],
                     dtypes=["Float"], nbytes=512 * 512 * 4, dur_ns=(world - 1 - r) * lag_ns + 50_000)
        log.close(T0_NS + steps * 1_000_000)
        log.write(tmp_path)
    return load_job([tmp_path])


def test_collective_table_times_and_bandwidth(tmp_path):
    job = _staggered_job(tmp_path)
    [row] = collective_table(job)
    size = 512 * 512 * 4
    assert (row["op"], row["group_size"], row["count"], row["timed"]) == ("all_reduce", 4, 5, 5)
    assert row["bytes"] == 5 * size
    # duration: first arrival (rank 0) to last completion (rank 3: 30 us late + 50 us)
    assert row["mean_s"] == pytest.approx((3 * 10_000 + 50_000) * 1e-9)
    assert row["transfer_s"] == pytest.approx(5 * 50_000 * 1e-9)     # the fastest rank's own 50 us, 5 times
    assert row["queue_mean_s"] is None  # nothing ran on a GPU
    assert row["algbw_gbps"] == pytest.approx(size / 50e-6 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)
    assert row["arrival_skew_mean_s"] == pytest.approx(30_000e-9)


def test_nccl_gpu_durations_are_the_transfer_time(tmp_path):
    """With TORCH_NCCL_ENABLE_TIMING, Flight Recorder's retired NCCL entries carry duration_ms from CUDA events
    (FlightRecorderDetail.hpp, ``retire_id``: ``duration_ = getDurationFromEvent(*startEvent, *endEvent)``),
    while their completion time is when the watchdog noticed (here 50 us after arrival, as late as it likes):
    the transfer time is the shortest GPU time and the duration the longest, never the enqueue-to-discovery
    span."""
    fr = FrJob(world=2)
    for i in range(3):
        for r in fr.ranks:
            fr.collective(r, "all_reduce", [[512, 512]], t_ns=T0_NS + i * 1_000_000 + r * 10_000)
            fr.entries[r][-1]["duration_ms"] = 0.020 + 0.001 * r  # rank 0 20 us, rank 1 21 us
    fr.entries[1][0]["duration_ms"] = float("nan")  # not a duration: left out, rank 0's still counts
    fr.write(tmp_path)
    job = load_job([tmp_path])
    cols = next(iter(job.collectives.values()))
    assert [c.duration_ns for c in cols] == [(20_000, None), (20_000, 21_000), (20_000, 21_000)]
    [row] = collective_table(job)
    assert row["transfer_s"] == pytest.approx(3 * 20_000 * 1e-9)
    assert row["algbw_gbps"] == pytest.approx(512 * 512 * 4 / 20e-6 / 1e9)
    assert row["mean_s"] == pytest.approx((20_000 + 21_000 + 21_000) / 3 * 1e-9)  # the longest GPU time of each


def test_nccl_collectives_without_a_gpu_time_are_untimed(tmp_path):
    """A real H200 run: the NCCL entries Flight Recorder had not retired yet have no duration_ms, and their
    times are the enqueue and the watchdog's discovery: such a collective is counted, not timed (its
    enqueue-to-discovery span summed to 35.6 ms where the timed GPU work took 0.45 ms)."""
    fr = FrJob(world=2)
    for i in range(3):
        for r in fr.ranks:
            fr.collective(r, "all_reduce", [[512, 512]], t_ns=T0_NS + i * 1_000_000 + r * 10_000)
            if i < 2:
                fr.entries[r][-1]["duration_ms"] = 0.020
    fr.write(tmp_path)
    job = load_job([tmp_path])
    cols = next(iter(job.collectives.values()))
    assert all(c.on_gpu for c in cols) and cols[2].duration_ns == (None, None)
    [row] = collective_table(job)
    assert (row["count"], row["timed"]) == (3, 2)
    assert row["total_s"] == pytest.approx(2 * 20_000 * 1e-9)
    assert row["transfer_s"] == pytest.approx(2 * 20_000 * 1e-9)


def test_nccl_communication_time_is_the_gpu_time_not_the_discovery(tmp_path):
    """The report's communication on an NCCL job known from Flight Recorder alone is what the merged trace
    draws: each collective's duration_ms from its enqueue, nothing for one without (its 50 us
    enqueue-to-discovery span is the watchdog's polling, not communication)."""
    fr = FrJob(world=2)
    for i in range(3):
        for r in fr.ranks:
            fr.collective(r, "all_reduce", [[512, 512]], t_ns=T0_NS + i * 1_000_000 + r * 10_000,
                          duration_ms=0.020 if i < 2 else None)
    fr.write(tmp_path)
    job = load_job([tmp_path])
    for rank in fr.ranks:
        comm = rank_activity(job, rank, None).comm
        assert length(union(comm)) == 2 * 20_000, comm
        assert [c.work_of(c.ranks.index(rank)) for c in next(iter(job.collectives.values()))][:2] == [
            (b, b + 20_000) for b, _ in comm]


def test_stragglers_rank_the_last_arriver_first(tmp_path):
    job = _staggered_job(tmp_path)
    rows = straggler_table(job)
    assert rows[0]["rank"] == 3
    assert rows[0]["last_arrivals"] == 5 and rows[0]["matched"] == 5
    assert rows[0]["mean_lateness_s"] == pytest.approx(30_000e-9)
    by_rank = {r["rank"]: r for r in rows}
    assert by_rank[1]["p99_lateness_s"] == pytest.approx(10_000e-9)
    assert by_rank[0]["last_arrivals"] == 0
    heat = lateness_map(job, columns=3)
    assert heat["ranks"] == [0, 1, 2, 3] and len(heat["collectives"]) == 3
    assert [row[0] for row in heat["lateness_s"]] == pytest.approx([0.0, 10e-6, 20e-6, 30e-6])



def test_ranks_that_arrive_last_together_are_none_of_them_the_last(tmp_path):
    """Ranks 2 and 3 arrive at the same instant, after 0 and 1: no collective had one last rank, so nobody
    gets a last arrival, not the lowest (or highest) of the two by a tie rule; their lateness still counts."""
    for r in range(4):
        log = EventLog(rank=r, world=4)
        log.group(0, "0", "default_pg", [0, 1, 2, 3])
        for i in range(3):
            log.call("all_reduce", T0_NS + i * 1_000_000 + min(r, 2) * 10_000, seq=i + 1, shapes=[[4]],
                     dtypes=["Float"], nbytes=16, dur_ns=50_000)
        log.close(T0_NS + 3 * 1_000_000)
        log.write(tmp_path)
    job = load_job([tmp_path])
    rows = {r["rank"]: r for r in straggler_table(job)}
    assert [rows[r]["last_arrivals"] for r in range(4)] == [0, 0, 0, 0]
    assert rows[2]["mean_lateness_s"] == rows[3]["mean_lateness_s"] == pytest.approx(20_000e-9)
    assert all(c.last_arrival_rank is None for c in next(iter(job.collectives.values())))

def test_steps_filter_collectives_by_first_arrival(tmp_path):
    """Two recorded steps; --steps 2 keeps only the collective issued during step 2."""
    ms = 1_000_000
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.step(1, T0_NS)
        log.call("all_reduce", T0_NS + 1 * ms, seq=1, shapes=[[4]], dtypes=["Float"], nbytes=16, step=1)
        log.step(2, T0_NS + 10 * ms)
        log.call("broadcast", T0_NS + 11 * ms, seq=2, shapes=[[8]], dtypes=["Float"], nbytes=32, step=2)
        log.close(T0_NS + 20 * ms)
        log.write(tmp_path)
    job = load_job([tmp_path])
    everything = build_report(job, {})
    assert sorted(r["op"] for r in everything["collectives"]) == ["all_reduce", "broadcast"]
    only2 = build_report(job, {}, steps=(2, 2))
    assert [r["op"] for r in only2["collectives"]] == ["broadcast"]
    assert [r["op"] for r in only2["modules"]] == ["broadcast"]
    assert [s["step"] for s in only2["steps"]] == [2]


# --- modules --------------------------------------------------------------------------------------------------


def test_module_table_counts_each_collective_once_across_ranks(tmp_path):
    for rank in (0, 1):
        log = EventLog(rank=rank, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        t = T0_NS
        for i in range(3):  # three forward all-reduces in net2, one backward in net1
            log.call("all_reduce", t + i, seq=i + 1, module="MLP.net2", pass_="forward", nbytes=2048)
        log.call("all_reduce", t + 10, seq=4, module="MLP.net1", pass_="backward", nbytes=1024)
        log.call("barrier", t + 20, seq=5)
        log.close(t + 30)
        log.write(tmp_path)
    job = load_job([tmp_path])
    rows = {(r["path"], r["pass"], r["op"]): r for r in module_table(job)}
    assert rows[("MLP.net2", "forward", "all_reduce")]["count"] == 3
    assert rows[("MLP.net2", "forward", "all_reduce")]["bytes"] == 3 * 2048
    assert rows[("MLP.net2", "forward", "all_reduce")]["ranks"] == 2
    assert rows[("MLP.net1", "backward", "all_reduce")]["count"] == 1
    assert rows[(OUTSIDE, None, "barrier")]["count"] == 1
    depth1 = {(r["path"], r["pass"]): r["count"] for r in module_table(job, depth=1)}
    assert depth1[("MLP", "forward")] == 3 and depth1[("MLP", "backward")] == 1
    assert not any(r["path"] == NOT_SEEN for r in module_table(job))


def test_module_table_keeps_collectives_issued_from_cpp(tmp_path):
    fr = FrJob(world=2, backend="gloo")
    for r in fr.ranks:
        for _ in range(6):
            fr.collective(r, "all_reduce", [[64]])
    fr.write(tmp_path)
    [row] = module_table(load_job([tmp_path]))
    assert (row["path"], row["op"], row["count"], row["bytes"], row["ranks"]) == (NOT_SEEN, "all_reduce", 6,
                                                                                  6 * 64 * 4, 2)


def test_span_reader_agrees_with_the_event_reader(tmp_path):
    """read_kineto_spans (report's fast path) keeps exactly the times read_kineto's events have."""
    from comm2perfetto.sources.kineto.classify import COMM_NAME
    from comm2perfetto.sources.kineto.reader import read_kineto, read_kineto_spans
    from support.kineto_fixtures import training_doc

    doc, _scene = training_doc()
    path = doc.write(tmp_path / "rank0.json.gz")
    full, spans = read_kineto(path), read_kineto_spans(path, cpu=True)
    for klass in ("compute", "comm", "memory"):
        expected = sorted((e.t_begin_ns, e.t_end_ns) for e in full.gpu_events if e.klass == klass)
        assert sorted(spans.gpu[klass]) == expected, klass
    assert spans.gpu["comm"] and spans.gpu["compute"] and spans.gpu["memory"]
    compute = sorted((e.t_begin_ns, e.t_end_ns) for e in full.cpu_ops
                     if e.kind in ("cpu_op", "user_annotation") and not e.name.startswith("ProfilerStep#")
                     and not COMM_NAME.search(e.name))
    assert sorted(spans.cpu_compute) == compute and compute
    assert sorted(spans.comm) == sorted((e.t_begin_ns, e.t_begin_ns + e.duration_ns) for e in full.comm_events)
    assert spans.steps == full.steps and spans.event_count == full.event_count


def test_span_reader_skips_the_cpu_side_of_a_gpu_trace(tmp_path):
    """Report uses kernels alone when a trace has them: the CPU ops are not read, the rest is as before."""
    from comm2perfetto.sources.kineto.reader import read_kineto_spans
    from support.kineto_fixtures import training_doc

    path = training_doc()[0].write(tmp_path / "rank0.json.gz")
    everything, fast = read_kineto_spans(path, cpu=True), read_kineto_spans(path)
    assert everything.cpu_read and everything.cpu_compute and everything.comm
    assert not fast.cpu_read and fast.cpu_compute == [] and fast.comm == []
    assert fast.gpu == everything.gpu and fast.steps == everything.steps
    assert fast.event_count == everything.event_count


def test_span_reader_reads_the_cpu_side_when_a_guess_of_kernels_was_wrong(tmp_path):
    """"kernel" in the text, no kernel in the trace: the CPU side is read after all."""
    from comm2perfetto.sources.kineto.reader import read_kineto_spans

    doc = KinetoDoc(rank=0, world_size=1)
    main = doc.thread(doc.pid, "python")
    doc.cpu(main, "ProfilerStep#1", 0.0, 100.0, cat="user_annotation")
    doc.cpu(main, "aten::mm", 10.0, 30.0, extra={"note": "kernel"})
    doc.cpu(main, "record_param_comms", 50.0, 20.0)
    path = doc.write(tmp_path / "rank0.pt.trace.json")
    assert b'"kernel"' in path.read_bytes()
    spans = read_kineto_spans(path)
    assert spans.cpu_read and spans.gpu == {"compute": [], "comm": [], "memory": []}
    assert spans == read_kineto_spans(path, cpu=True)
    assert len(spans.cpu_compute) == 1 and len(spans.comm) == 1 and len(spans.steps) == 1


# --- which steps the figures cover ---------------------------------------------------------------------------


def _profiled_only(steps, windows):
    return _RankFacts.of(RankActivity(0, Basis.CPU, ("profiler CPU ops",), [(0, 1)], [], [], tuple(steps),
                                      compute_windows=tuple(windows)))


def test_report_says_which_steps_its_figures_cover_when_compute_is_profiled_only():
    # Steps 1-6 of 10 ns each; the profiler ran over steps 3-4.
    steps = [(n, n * 10, n * 10 + 10) for n in range(1, 7)]
    activities = {0: _profiled_only(steps, [(30, 50)])}
    assert _profiled_note(activities, None) == [
        "compute is known only in the profiled steps 3-4: these figures cover steps 1-6; in the 4 unprofiled "
        "ones compute is not measured: '-' (null) in their rows, and the run's figures count none there; "
        "--steps 3-4 reports those alone"]
    assert _profiled_note(activities, (3, 4)) == [
        "compute is known only in the profiled steps 3-4: these figures cover steps 3-4, all profiled"]
    # Compute from ranges too (compute_windows None): known everywhere, nothing to say.
    assert _profiled_note({0: _RankFacts.of(RankActivity(0, Basis.CPU, (), [], [], [], tuple(steps)))}, None) == []
    assert steps_text([1, 2, 3, 7, 9, 10]) == "1-3,7,9-10"


def test_a_figure_not_measured_in_a_step_is_none_not_zero():
    """Steps 1-4 of 10 ns; the profiler ran over steps 2-3 (compute known there only) and a collective nothing
    timed arrived in step 3: step 2 is measured, step 1 and 4 have no compute, step 3 no communication; a
    total is known where every part is."""
    steps = tuple((n, n * 10, n * 10 + 10) for n in range(1, 5))
    a = RankActivity(0, Basis.CPU, (), compute=[(20, 25), (30, 35)], comm=[(24, 28)], memory=[], steps=steps,
                     compute_windows=((20, 40),), untimed=(33,))
    rows = {n: breakdown(a, (b, e)).as_dict() for n, b, e in steps}
    assert rows[2] == pytest.approx({"span_s": 10e-9, "compute_s": 5e-9, "comm_s": 4e-9, "overlapped_comm_s": 1e-9,
                                     "exposed_comm_s": 3e-9, "idle_s": 2e-9, "comm_to_compute": 4 / 5,
                                     "overlap_pct": 25.0}, abs=1e-15)
    assert rows[1]["comm_s"] == rows[4]["comm_s"] == 0.0 and rows[3]["compute_s"] == 5e-9  # measured
    for n, measured in ((1, "comm_s"), (4, "comm_s"), (3, "compute_s")):
        assert [k for k, v in rows[n].items() if v is None] == [
            "compute_s" if measured == "comm_s" else "comm_s", "overlapped_comm_s", "exposed_comm_s", "idle_s",
            "comm_to_compute", "overlap_pct"], rows[n]
    job = job_breakdown([breakdown(a, (20, 30)), breakdown(a, (10, 20))])
    assert job["span_s"] == 10e-9 and job["compute_s"] is None and job["comm_s"] == 2e-9 and job["idle_s"] is None


# --- memory that follows the answer ------------------------------------------------------------------------------


def test_report_reads_each_collective_once_for_all_its_tables(tmp_path, monkeypatch):
    # A group too big to keep its views (as one of 16,384 ranks is): every table is fed in one pass, so each
    # field of each collective is decoded once; only the lateness map's drawn columns read their arrivals again.
    monkeypatch.setattr(group_columns, "SMALL_GROUP_CELLS", 0)
    steady_job(4, 300).write(tmp_path)
    job = load_job([tmp_path])
    expected = build_report(job, {})
    reads: Counter[tuple[str, int]] = Counter()
    read = GroupCollectives.values

    def counted(self, name, index):
        reads[(name, index)] += 1
        return read(self, name, index)

    monkeypatch.setattr(GroupCollectives, "values", counted)
    doc = build_report(job, {})
    assert doc == expected
    again = {index for (_, index), n in reads.items() if n > 1}
    assert len(again) == len(doc["lateness_map"]["collectives"]) == 200  # drawn: 200 of the 300
    # a drawn column's arrivals (ready_ns: GPU begins, else arrivals) and its label's op (signatures)
    assert {name for (name, _), n in reads.items() if n > 1} == {"gpu_begin_ns", "arrive_ns", "signatures"}
    assert max(reads.values()) == 2 and {index for _, index in reads} == set(range(300))
