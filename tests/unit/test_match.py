"""Matching records across ranks into collectives and p2p transfers."""

from __future__ import annotations

import pytest

from comm2perfetto.load_options import LoadOptions
from comm2perfetto.match import load_job
from comm2perfetto.model import COMPLETED, PENDING, UNKNOWN
from support.factories import STEP_NS, T0_NS, EventLog, FrJob


def test_one_collective_per_group_and_seq_with_per_rank_arrival(tmp_path):
    job = FrJob(world=3)
    arrivals = {0: T0_NS + 100, 1: T0_NS + 900, 2: T0_NS + 400}
    for r in job.ranks:
        job.collective(r, "all_reduce", [[8]], t_ns=arrivals[r])
        job.collective(r, "broadcast", [[2]])
    job.set_state(1, 2, "started")
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    c1, c2 = loaded.collectives["0[0,1,2]"]
    assert (c1.seq, c1.op, c2.seq, c2.op) == (1, "all_reduce", 2, "broadcast")
    assert c1.arrive_ns == tuple(arrivals[r] for r in (0, 1, 2))
    assert c1.last_arrival_rank == max(arrivals, key=arrivals.get)
    assert c1.arrival_skew_ns == max(arrivals.values()) - min(arrivals.values())
    assert c2.states == (COMPLETED, "started", COMPLETED) and not c2.completed_everywhere
    assert loaded.collectives["0[0,1,2]"].find(2) is c2 and loaded.collectives["0[0,1,2]"].find(3) is None


def test_groups_with_one_name_and_different_ranks_are_different_groups(tmp_path):
    # split_group gives disjoint groups the same name on different ranks: pg_config tells them apart.
    job = FrJob(world=4)
    job.group("5", [0, 1], desc="pair")
    for r in (0, 1):
        job.collective(r, "all_reduce", [[4]], pg="5")
    job.write(tmp_path, ranks=[0, 1])
    job.group("5", [2, 3], desc="pair")
    for r in (2, 3):
        job.collective(r, "all_reduce", [[4]], pg="5")
    job.write(tmp_path, ranks=[2, 3])
    loaded = load_job([tmp_path])
    assert sorted(loaded.groups) == ["0[0,1,2,3]", "5[0,1]", "5[2,3]"]
    assert [c.joined_ranks for c in loaded.collectives["5[2,3]"]] == [(2, 3)]


def test_recorder_call_and_fr_entry_of_one_call_become_one_record(tmp_path):
    job = FrJob(world=2, backend="gloo")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="scheduled", t_ns=T0_NS + 1000)
    job.write(tmp_path, prefix="rank")  # rank0, rank1
    offset = -2_000_000  # rank 1's clock is 2 ms ahead of rank 0's
    t_call = {0: T0_NS, 1: T0_NS + 500 - offset}
    for r in job.ranks:
        log = EventLog(rank=r, world=2, offset_ns=offset if r else 0)
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", t_call[r], seq=1, shapes=[[4]], dtypes=["Float"], dur_ns=30_000)
        log.write(tmp_path)
    (c,) = load_job([tmp_path]).collectives["0[0,1]"]
    assert c.sources == ("fr+log", "fr+log")
    assert c.arrive_ns == (T0_NS, T0_NS + 500)  # the recorder's call times, rank 1 shifted by its offset
    assert c.end_ns == (T0_NS + 30_000, T0_NS + 500 + 30_000)
    assert c.states == (COMPLETED, COMPLETED)  # gloo FR says "scheduled"; the call returned
    assert c.signatures[0].source == "fr" and c.signatures[0].output_sizes == ((4,),)


def test_recorder_p2p_calls_between_collectives_keep_fr_numbering(tmp_path):
    # The recorder numbers collectives as FR does: a p2p call leaves seq_last at the previous collective.
    for r in (0, 1):
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_reduce", T0_NS, seq=1, shapes=[[4]], dtypes=["Float"])
        log.call("send" if r == 0 else "recv", T0_NS + STEP_NS, peer=1 - r, shapes=[[4]], dtypes=["Float"],
                 seq_last=1)
        log.call("all_reduce", T0_NS + 2 * STEP_NS, seq=2, shapes=[[6]], dtypes=["Float"])
        log.write(tmp_path)
    job = FrJob(world=2, backend="gloo")  # rank 0 also left a Flight Recorder dump
    job.collective(0, "all_reduce", [[4]], state="scheduled")
    job.collective(0, "all_reduce", [[6]], state="scheduled")
    job.write(tmp_path, prefix="rank", ranks=[0])
    loaded = load_job([tmp_path])
    cols = loaded.collectives["0[0,1]"]
    assert [c.seq for c in cols] == [1, 2]
    assert [c.signatures[1].input_sizes for c in cols] == [((4,),), ((6,),)]
    assert cols[1].sources == ("fr+log", "log")
    (transfer,) = loaded.p2p["0[0,1]"]
    assert (transfer.src, transfer.dst, transfer.matched) == (0, 1, True)


def test_fr_p2p_ops_pair_in_order_per_sender_and_receiver(tmp_path):
    job = FrJob(world=3)
    job.p2p(0, "send", 1, [[4]])
    job.p2p(0, "send", 2, [[5]])
    job.p2p(0, "send", 1, [[6]])
    job.p2p(1, "recv", 0, [[4]])
    job.p2p(1, "recv", 0, [[6]])
    job.p2p(2, "recv", 0, [[5]])
    job.p2p(2, "recv", 1, [[7]])  # nobody sends it
    job.write(tmp_path)
    transfers = load_job([tmp_path]).p2p["0[0,1,2]"]
    pairs = [(t.src, t.dst, t.index, t.matched,
              (t.send or t.recv).signature.input_sizes) for t in transfers]
    assert pairs == [(0, 1, 0, True, ((4,),)), (0, 1, 1, True, ((6,),)), (0, 2, 0, True, ((5,),)),
                     (1, 2, 0, False, ((7,),))]


def test_a_call_issuing_several_collectives_covers_its_seqs(tmp_path):
    for r in (0, 1):
        log = EventLog(rank=r, world=2)
        log.group(0, "0", "default_pg", [0, 1])
        log.call("all_gather_object", T0_NS, seq=1, seq_last=2)
        log.call("barrier", T0_NS + STEP_NS, seq=3, returns=r == 0)  # rank 1 never returned
        log.write(tmp_path)
    cols = load_job([tmp_path]).collectives["0[0,1]"]
    assert [(c.seq, c.op) for c in cols] == [(1, "all_gather_object"), (2, "all_gather_object"), (3, "barrier")]
    assert cols[2].states == (COMPLETED, PENDING)


def _unnumbered_logs(tmp_path, sizes: dict[int, list[int]], fr_rank: int | None = None) -> None:
    """Two ranks' logs of a group whose backend keeps no sequence counter: every call's seq is null."""
    for r in (0, 1):
        log = EventLog(rank=r, world=2, backend="custom")
        log.group(0, "0", "default_pg", [0, 1])
        for i, n in enumerate(sizes[r]):
            log.call("all_reduce", T0_NS + i * STEP_NS, shapes=[[n]], dtypes=["Float"], returns=i < 2 or r == 0)
        log.write(tmp_path)
    if fr_rank is not None:
        job = FrJob(world=2, backend="custom")
        job.collective(fr_rank, "all_reduce", [[4]])
        job.write(tmp_path, prefix="rank", ranks=[fr_rank])


def test_collectives_without_sequence_numbers_match_by_order(tmp_path):
    _unnumbered_logs(tmp_path, {0: [4, 6, 8], 1: [4, 5, 8]})
    loaded = load_job([tmp_path])
    cols = loaded.collectives["0[0,1]"]
    assert [c.seq for c in cols] == [1, 2, 3]
    assert [tuple(s.input_sizes for s in c.signatures) for c in cols] == [
        (((4,),), ((4,),)), (((6,),), ((5,),)), (((8,),), ((8,),))]  # the second disagrees: diagnose sees it
    assert cols[2].states[1] == PENDING  # rank 1's third call never returned
    assert any("matched across ranks by their order" in note for note in loaded.notes)


def test_order_numbers_are_not_mixed_with_sequence_numbers(tmp_path):
    _unnumbered_logs(tmp_path, {0: [4, 6], 1: [4, 6]}, fr_rank=0)  # rank 0's Flight Recorder numbers seq 1
    loaded = load_job([tmp_path])
    assert [c.sources for c in loaded.collectives["0[0,1]"]] == [("fr", None)]
    assert any("carry no sequence number while others do" in note for note in loaded.notes)


@pytest.mark.parametrize(("backend", "state"), [("gloo", COMPLETED), ("cpu:gloo", COMPLETED),
                                              ("cpu:gloo,cuda:nccl", UNKNOWN), ("nccl", UNKNOWN)])
def test_a_synchronous_call_completed_on_a_cpu_only_backend(tmp_path, backend, state):
    """A group made without naming a backend logs its backends (``cpu:gloo``): gloo alone returns once done."""
    log = EventLog(rank=0, world=1, backend=backend)
    log.group(0, "0", "default_pg", [0])
    log.call("all_reduce", T0_NS, seq=1, shapes=[[4]], dtypes=["Float"])
    log.write(tmp_path)
    (c,) = load_job([tmp_path]).collectives["0[0]"]
    assert c.states == (state,)


def test_ring_buffer_wrap_marks_coverage(tmp_path):
    job = FrJob(world=2)
    for _ in range(6):
        for r in job.ranks:
            job.collective(r, "all_reduce", [[4]])
    job.entries[1] = job.entries[1][2:]  # rank 1's oldest records were overwritten
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    cov0, cov1 = (loaded.coverage[(r, "0[0,1]")] for r in (0, 1))
    assert (cov0.first_seq, cov0.last_seq) == (0, 6)
    assert (cov1.first_seq, cov1.last_seq) == (3, 6)
    assert cov1.completed_upto == 6


def test_loading_in_worker_processes_gives_the_same_job(tmp_path):
    job = FrJob(world=6)
    for step in range(5):
        for r in job.ranks:
            sizes = [[9]] if (r, step) == (4, 3) else [[8]]
            job.collective(r, "all_reduce", sizes, site=f"train.py:{60 + step}")
    job.p2p(0, "send", 5, [[2]])
    job.p2p(5, "recv", 0, [[2]])
    job.write(tmp_path)
    serial = load_job([tmp_path], LoadOptions(workers=1))
    parallel = load_job([tmp_path], LoadOptions(workers=2))

    def view(j):
        return [(c.seq, c.signatures, c.states, c.arrive_ns, [c.part(r).call_site for r in c.ranks])
                for c in j.collectives["0[0,1,2,3,4,5]"]]

    assert view(serial) == view(parallel)
    # Signatures are interned again in this process: ranks that agree share one object, as when serial.
    c = parallel.collectives["0[0,1,2,3,4,5]"][0]
    assert all(s is c.signatures[0] for s in c.signatures)
    assert [t.matched for t in parallel.p2p["0[0,1,2,3,4,5]"]] == [True]


def test_workers_that_fail_midway_leave_the_rest_to_this_process(tmp_path, monkeypatch):
    """Two ranks come back from the workers, then the pool breaks: the other ranks are read here, each once,
    and the notes say so."""
    from comm2perfetto.sources import read

    job = FrJob(world=4)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[8]])
    job.write(tmp_path)
    real = read._load_parallel

    def breaks(per_rank, workers, with_stacks):
        for n, result in enumerate(real(per_rank, workers, with_stacks)):
            if n == 2:
                raise OSError("a worker died")
            yield result

    monkeypatch.setattr(read, "_load_parallel", breaks)
    seen = []
    loaded = load_job([tmp_path], LoadOptions(workers=2, progress=lambda done, total: seen.append((done, total))))
    assert [c.joined_ranks for c in loaded.collectives["0[0,1,2,3]"]] == [(0, 1, 2, 3)]
    assert seen == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert any("worker processes failed (OSError); the ranks left were read in this process" in n
               for n in loaded.notes)


def test_plain_dumps_of_a_long_ring_are_aligned_on_an_even_sample_of_their_completions(tmp_path):
    """Rank 1's clock is 3 s ahead; its 1,000 completions are compared with rank 0's over every 4th seq (at
    most FR_END_SAMPLES), read as column slices, and the dict path on plain rows gives the same differences."""
    from comm2perfetto.group_columns import rows_of
    from comm2perfetto.match import FR_END_SAMPLES, _end_differences
    from comm2perfetto.sources.read import load_sources

    job = FrJob(world=2)
    for r in job.ranks:
        for i in range(1000):
            job.collective(r, "all_reduce", [[4]], t_ns=T0_NS + i * STEP_NS + (3 * 10**9 + i % 7 * 1000 if r else 0))
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    assert loaded.clock.method[1] == "refined" and abs(loaded.clock.offset_ns[1] + 3 * 10**9) < 10_000
    assert loaded.clock.samples == 1000 // 4 <= FR_END_SAMPLES
    src = load_sources([tmp_path])
    (t0,), (t1,) = (list(src.fr[r].groups.values()) for r in (0, 1))
    sampled = _end_differences(t1, t0)
    assert len(sampled) == 250 and sampled == _end_differences(rows_of(t1), rows_of(t0))
    assert sorted({d // 1000 for d in sampled}) == [3_000_000 + k for k in range(7)]


def test_group_members_read_as_ranges_where_consecutive(tmp_path):
    """A group's members from a dump's pg_config or a recorder log are a range where consecutive (nothing per
    rank to hash or compare at 16,384 ranks) and a tuple otherwise; the group ids read the same either way."""
    from comm2perfetto.sources.read import load_sources

    job = FrJob(world=4)
    job.group("5", [0, 2], desc="even")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]])
    for r in (0, 2):
        job.collective(r, "all_reduce", [[4]], pg="5")
    job.write(tmp_path)
    for r in job.ranks:
        log = EventLog(rank=r, world=4)
        log.group(0, "0", "default_pg", [0, 1, 2, 3])
        if r in (0, 2):
            log.group(1, "5", "even", [0, 2])
        log.write(tmp_path)
    src = load_sources([tmp_path])
    assert src.fr[1].pg_config["0"].ranks == range(4) and src.fr[2].pg_config["5"].ranks == (0, 2)
    assert src.logs[3].groups[0].ranks == range(4) and src.logs[2].groups[1].ranks == (0, 2)
    assert sorted(load_job([tmp_path]).groups) == ["0[0,1,2,3]", "5[0,2]"]


def test_the_collectives_span_is_the_first_arrival_and_the_last_arrival_or_end(tmp_path):
    # merge's time origin and the trace's last instant: read a collective at a time, with ranks missing
    job = FrJob(world=3)
    job.group("4", [1, 2], desc="pair")
    for r in job.ranks:
        job.collective(r, "all_reduce", [[8]], t_ns=T0_NS + 500 + r)
    job.collective(1, "broadcast", [[2]], pg="4", t_ns=T0_NS + 10_000)
    job.collective(2, "broadcast", [[2]], pg="4", t_ns=T0_NS + 20_000, state="started")
    job.collective(0, "all_reduce", [[8]], t_ns=T0_NS + 30_000, state="started")  # ranks 1, 2 never join
    job.write(tmp_path)
    loaded = load_job([tmp_path], LoadOptions(align=False))
    every = [t for c in loaded.iter_collectives() for t in c.arrive_ns + c.end_ns if t is not None]
    assert loaded.collectives_span() == (T0_NS + 500, max(every))
    assert max(every) == T0_NS + 10_000 + 50_000  # the broadcast's end on rank 1, after every arrival
    empty = FrJob(world=2)
    empty.write(tmp_path / "none")
    assert load_job([tmp_path / "none"], LoadOptions(align=False, force=True)).collectives_span() == (None, None)
