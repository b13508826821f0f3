"""Reading Flight Recorder dumps of every format version, pickle and JSON."""

from __future__ import annotations

import pickle

import pytest

from comm2perfetto.match import load_job
from comm2perfetto.model import COMPLETED, STARTED, UNKNOWN, call_site
from comm2perfetto.sources.fr.dump import (
    CollectiveStacks,
    FrFormatError,
    parse_fr_document,
    rank_from_name,
    read_fr_dump,
    split_profiling_name,
)
from comm2perfetto.sources.fr.ingest import build_rank_trace
from comm2perfetto.sources.fr.tables import SignatureTable, StackTable
from support.factories import FrJob, steady_job


@pytest.mark.parametrize("name, rank", [
    ("rank5.fr.3.pkl", 5), ("rank5.fr-nccl.12.pkl", 5), ("nccl_trace_rank_5", 5), ("comm_lib_trace_rank_5", 5),
    ("rank5.pkl", 5), ("nccl_trace_rank_container-node02_5", 5), ("trace_rank3_host7.json", 7),
    ("dump_file_rank_12", 12), ("no_rank_here.pkl", None),
])
def test_rank_from_name(name, rank):
    assert rank_from_name(name) == rank


def test_split_profiling_name():
    assert split_profiling_name("nccl:all_reduce") == ("nccl", "all_reduce", None, None)
    assert split_profiling_name("nccl:send 1->0") == ("nccl", "send", 1, 0)
    assert split_profiling_name("nccl:recv 0<-1") == ("nccl", "recv", 1, 0)
    assert split_profiling_name("xccl:_broadcast_oop") == ("xccl", "_broadcast_oop", None, None)


VERSIONS = ["list", "2.2", "2.3", "2.4", "2.7", "2.9", "2.10"]


# JSON dumps never were bare lists: that pair does not exist.
VERSION_FORMATS = [(v, f) for v in VERSIONS for f in ("pickle", "json") if (v, f) != ("list", "json")]


@pytest.mark.parametrize("version, fmt", VERSION_FORMATS)
def test_every_version_and_format_gives_the_same_collectives(tmp_path, version, fmt):
    steps = 6
    job = steady_job(world=3, steps=steps, version=version)
    job.write(tmp_path, fmt=fmt)
    loaded = load_job([tmp_path])
    (cols,) = loaded.collectives.values()
    assert [c.seq for c in cols] == list(range(1, steps + 1))
    assert [c.op for c in cols] == [["all_reduce", "all_gather", "_reduce_scatter_base", "broadcast"][i % 4]
                                    for i in range(steps)]
    assert all(c.completed_everywhere for c in cols)
    assert cols[0].signatures[0].input_sizes == ((1024, 1024),)
    has_dtypes = version == "list" or tuple(map(int, version.split("."))) < (2, 3)
    assert (cols[0].signatures[0].input_dtypes is None) == has_dtypes
    # Stacks come from pickles only (JSON dumps carry no frames).
    site = cols[1].part(0).call_site
    assert (site.site if site else None) == ("train.py:51" if fmt == "pickle" else None)


def test_json_zero_times_mean_unknown(tmp_path):
    job = FrJob(world=2)
    for r in job.ranks:
        job.collective(r, "all_reduce", [[4]], state="scheduled")
    job.write(tmp_path, fmt="json")
    c = load_job([tmp_path]).collectives["0[0,1]"][0]
    assert c.start_ns == (None, None) and c.end_ns == (None, None)
    assert c.states == ("scheduled", "scheduled")


def test_truncated_pickle_is_a_format_error(tmp_path):
    data = pickle.dumps(FrJob(world=1).document(0), protocol=2)
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(FrFormatError, match="corrupt or truncated"):
        read_fr_dump(path)


def test_a_pickle_that_is_not_a_dump_is_a_format_error(tmp_path):
    path = tmp_path / "rank0.pkl"
    path.write_bytes(pickle.dumps({"weights": [1, 2, 3]}, protocol=2))
    with pytest.raises(FrFormatError, match="not a Flight Recorder dump"):
        read_fr_dump(path)
    path.write_bytes(pickle.dumps({"version": "2.10", "entries": [1, 2]}, protocol=2))
    with pytest.raises(FrFormatError, match="not a list of records"):
        read_fr_dump(path)


def _trace(job: FrJob, rank: int, **kw):
    dump = read_fr_dump(f"nccl_trace_rank_{rank}", pickle.dumps(job.document(rank), protocol=2))
    trace, conflict = build_rank_trace(rank, [dump], StackTable(), SignatureTable(), **kw)
    assert conflict is None
    return trace


def test_coalesced_entries_fold_into_one_collective_with_parts():
    job = FrJob(world=2, version="2.8")
    job.collective(0, "all_reduce", [[4]])
    parts = [("_broadcast_oop", [[4, 4]], [[4, 4]]), ("_broadcast_oop", [[5, 5]], [[5, 5]])]
    job.collective(0, "ALLGATHER_coalesced", [], [], coalesced=parts, state="started")
    trace = _trace(job, 0)
    (track,) = trace.groups.values()
    assert track.seqs == [1, 2]
    sig = track.sigs[1]
    assert sig.op == "ALLGATHER_coalesced"
    assert [(p.op, p.input_sizes) for p in sig.parts] == [("_broadcast_oop", ((4, 4),)), ("_broadcast_oop", ((5, 5),))]
    assert track.states[1] == STARTED  # the closing entry's state, not the members' "scheduled"


def test_batched_p2p_ops_take_the_closing_entrys_state():
    job = FrJob(world=2)
    job.p2p(0, "send", 1, [[8]], batch=True)
    job.p2p(0, "recv", 1, [[8]], batch=True)
    job.close_batch(0, state="completed")
    (track,) = _trace(job, 0).groups.values()
    assert [(row[0], row[1], row[4]) for row in track.p2p] == [("send", 1, COMPLETED), ("recv", 1, COMPLETED)]


def test_gloo_states_are_unknown_unless_pg_status_says_completed():
    job = FrJob(world=2, backend="gloo")
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]], state="scheduled")
    doc = job.document(0)
    # Gloo counts last_completed_collective in op ids: with a p2p op in between, op ids run ahead of seqs.
    doc["entries"][2]["op_id"] = 4
    doc["pg_status"]["0"]["last_completed_collective"] = 2
    dump = read_fr_dump("nccl_trace_rank_0", pickle.dumps(doc, protocol=2))
    trace, _ = build_rank_trace(0, [dump], StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert track.states == [COMPLETED, COMPLETED, UNKNOWN]
    assert trace.backend == "gloo"


def test_overlapping_snapshots_of_one_rank_are_deduplicated(tmp_path):
    job = FrJob(world=1)
    for _ in range(4):
        job.collective(0, "all_reduce", [[4]])
    full = job.document(0)
    early = dict(full, entries=full["entries"][:3])
    late = dict(full, entries=full["entries"][1:])
    (tmp_path / "rank0.fr.1.pkl").write_bytes(pickle.dumps(early, protocol=2))
    (tmp_path / "rank0.fr.2.pkl").write_bytes(pickle.dumps(late, protocol=2))
    (cols,) = load_job([tmp_path]).collectives.values()
    assert [c.seq for c in cols] == [1, 2, 3, 4]


def test_the_newest_snapshot_gives_the_status_even_past_ten_files():
    """rank0.fr.10.pkl sorts before rank0.fr.2.pkl by name; its pg_status must still win."""
    job = FrJob(world=2, backend="gloo")
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]], state="scheduled")
    doc = job.document(0)
    dumps = []
    for n in range(1, 11):  # the same entries in every snapshot; only the last saw them all complete
        done = 3 if n == 10 else 1
        snapshot = dict(doc, pg_status={"0": dict(doc["pg_status"]["0"], last_completed_collective=done)})
        dumps.append(read_fr_dump(f"rank0.fr.{n}.pkl", pickle.dumps(snapshot, protocol=2)))
    dumps.sort(key=lambda d: d.path.name)  # discovery order: fr.1, fr.10, fr.2, ...
    trace, _ = build_rank_trace(0, dumps, StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert track.states == [COMPLETED, COMPLETED, COMPLETED]


def test_signatures_are_shared_between_ranks_that_agree():
    job = steady_job(world=3, steps=8)
    stacks, sigs = StackTable(), SignatureTable()
    traces = []
    for r in job.ranks:
        dump = read_fr_dump(f"nccl_trace_rank_{r}", pickle.dumps(job.document(r), protocol=2))
        traces.append(build_rank_trace(r, [dump], stacks, sigs)[0])
    col = [next(iter(t.groups.values())).sigs for t in traces]
    assert all(a is b for a, b in zip(col[0], col[2]))
    assert len(stacks.stacks) == 4  # four call sites, each interned once for the whole job


def test_debug_detail_dumps_have_no_group_names_and_fingerprint_helpers(tmp_path):
    # What TORCH_DISTRIBUTED_DEBUG=DETAIL writes (seen on torch 2.13, gloo): process_group ('', '') on every
    # entry, and the wrapper's helper group (pg_id 1) all-gathering a fingerprint's length, then the fingerprint,
    # before each collective of the real group (pg_id 0).
    job = FrJob(world=2, backend="gloo")
    job.group("1", [0, 1], desc="helper")
    for r in job.ranks:
        for size in ([[4]], [[6]]):
            job.collective(r, "all_gather", [[1]], [[2]], pg="1", state="scheduled")
            job.collective(r, "all_gather", [[7]], [[14]], pg="1", state="scheduled")
            job.collective(r, "all_reduce", size, state="scheduled")
        for e in job.entries[r]:
            e["process_group"] = ("", "")
    job.write(tmp_path)
    loaded = load_job([tmp_path])
    assert list(loaded.groups) == ["0[0,1]"]
    assert [c.signatures[0].input_sizes for c in loaded.collectives["0[0,1]"]] == [((4,),), ((6,),)]


def test_stacks_of_an_earlier_dump_survive_a_later_dump_without_them(tmp_path):
    """Periodic dumps leave Python stacks out (record/flight.py); a record an earlier dump had with its frames
    keeps them when a later snapshot without frames covers it too."""
    import pickle

    from comm2perfetto.sources.fr.dump import read_fr_dump
    from comm2perfetto.sources.fr.fields import Damage
    from comm2perfetto.sources.fr.snapshots import merge_snapshots

    frames = [{"name": "train_step", "filename": "train.py", "line": 57}]
    entry = {"record_id": 3, "pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 4,
             "profiling_name": "nccl:all_reduce", "time_created_ns": 1795313447000000000}
    with_frames = dict(entry, frames=frames)
    paths = []
    for n, e in ((1, with_frames), (2, entry)):
        path = tmp_path / f"rank0.fr.{n}.pkl"
        path.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "pg_status": {},
                                       "entries": [e, dict(entry, record_id=n + 10)]}))
        paths.append(path)
    dumps = [read_fr_dump(p) for p in paths]
    merged, conflict = merge_snapshots(dumps, Damage(dumps))
    assert conflict is None
    assert [e.get("frames") for e in merged if e["record_id"] == 3] == [frames]


def test_entries_whose_groups_are_lists_and_tuples_alike_all_load():
    """A dump mixing tuples and lists for process_group (lists as JSON writes them): the columns read each
    as a tuple; nothing is skipped."""
    job = FrJob(world=2)
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]])
    doc = job.document(0)
    doc["entries"][1]["process_group"] = list(doc["entries"][1]["process_group"])
    dump = read_fr_dump("nccl_trace_rank_0", pickle.dumps(doc, protocol=2))
    trace, _ = build_rank_trace(0, [dump], StackTable(), SignatureTable())
    (track,) = trace.groups.values()
    assert track.seqs == [1, 2, 3] and not trace.notes


def _three_all_reduces_with(key, value):
    """Rank 0's trace of three all-reduces, the second entry's ``key`` set to ``value``."""
    job = FrJob(world=2)
    for _ in range(3):
        job.collective(0, "all_reduce", [[4]])
    doc = job.document(0)
    doc["entries"][1][key] = value
    dump = read_fr_dump("nccl_trace_rank_0", pickle.dumps(doc, protocol=2))
    return build_rank_trace(0, [dump], StackTable(), SignatureTable())[0]


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("time_created_ns", -5, "time_created_ns of record 1 (all_reduce #2 on default_pg) is -5, not a time"),
    ("time_discovered_completed_ns", "soon", "time_discovered_completed_ns of record 1 (all_reduce #2 on default_pg) "
                                             "is 'soon', not a time"),
    ("state", 5, "state of record 1 (all_reduce #2 on default_pg) is 5, not a state Flight Recorder writes"),
    ("record_id", "x", "record_id of a record (all_reduce #2 on default_pg) is 'x', not a record id"),
])
def test_a_damaged_field_is_skipped_and_named_and_its_entry_kept(key, value, problem):
    """The columns' conversion refuses the value; the rank is then checked entry by entry: the field reads as
    unknown, a note names it, and the rest of the entry (its collective) stays."""
    trace = _three_all_reduces_with(key, value)
    (track,) = trace.groups.values()
    assert track.seqs == [1, 2, 3] and not trace.unread
    assert track.states[1] == ("unknown" if key == "state" else "completed")
    (note,) = trace.notes
    assert note.startswith("nccl_trace_rank_0: 1 Flight Recorder field failed its check") and problem in note


@pytest.mark.parametrize(("key", "value", "unread"), [
    ("collective_seq_id", 2**63, (2, 2)),  # between #1 and #3
    ("profiling_name", 7, (2, 2)),  # its seq is readable
])
def test_an_entry_whose_identity_fails_is_skipped_and_its_seqs_unread(key, value, unread):
    trace = _three_all_reduces_with(key, value)
    (track,) = trace.groups.values()
    assert track.seqs == [1, 3] and trace.unread == {"0": (unread,)}
    (note,) = trace.notes
    assert "1 Flight Recorder entry skipped, its identity unreadable" in note and key in note
    assert "what rank 0 issued there reads as unknown, not as never issued" in note


def test_collective_stacks_take_the_latest_snapshot_and_a_coalesced_groups_first_entry(tmp_path):
    job = FrJob(world=1)
    job.group("1", [0])
    job.collective(0, "all_reduce", [[4]], site="train.py:10")
    job.collective(0, "all_reduce", [[4]], site="train.py:20", pg="1")
    job.collective(0, "all_reduce", [[4]], site="train.py:30", coalesced=[("all_reduce", [[2]], [[2]])] * 2)
    old = parse_fr_document(tmp_path / "a", {"version": "2.10", "entries": job.entries[0][:2]}, "pickle")
    entries = [dict(e) for e in job.entries[0]]
    entries[0]["frames"] = []  # a periodic dump without stacks: the older snapshot still has this one
    entries[1]["frames"] = [{"filename": "later.py", "line": 7, "name": "step"}]
    entries[3]["frames"] = entries[4]["frames"] = [{"filename": "closing.py", "line": 1, "name": "wait"}]
    entries.append(dict(entries[0], collective_seq_id=4.0, frames=entries[1]["frames"]))  # a seq that is no int
    new = parse_fr_document(tmp_path / "b", {"version": "2.10", "entries": entries}, "pickle")
    found = CollectiveStacks([old, new], StackTable())

    def site(key):
        frame = call_site(found.get(key))
        return f"{frame.file}:{frame.line}" if frame is not None else None

    assert site(("0", 1)).endswith("train.py:10")
    assert site(("1", 1)) == "later.py:7"  # the later snapshot wins
    assert site(("0", 2)).endswith("train.py:30")  # the coalesced group's first entry, not its closing one
    assert site(("0", 4)) is None and site(("2", 1)) is None and found.get(("0", 9), ("none",)) == ("none",)


def test_collective_stacks_read_every_format_alike(tmp_path):
    # The modern dump is read a row per C call; a dump mixing in an older entry (no is_p2p) and an entry with an
    # empty group (named by its pg_id) is read entry by entry: each collective gets its own call site either way.
    job = FrJob(world=1)
    for site in ("train.py:10", "train.py:20", "train.py:30"):
        job.collective(0, "all_reduce", [[4]], site=site)
    job.p2p(0, "send", 0, [[2]], site="pipe.py:5")
    entries = job.entries[0]
    modern = parse_fr_document(tmp_path / "a", {"version": "2.10", "entries": entries}, "pickle")
    old = [dict(e) for e in entries]
    del old[0]["is_p2p"]
    old[1]["process_group"] = ()
    mixed = parse_fr_document(tmp_path / "b", {"version": "2.10", "entries": old}, "pickle")

    def sites(dump, p2p=False):
        found = CollectiveStacks([dump], StackTable(), p2p)
        return {key: f"{site.file.rsplit('/', 1)[-1]}:{site.line}" for key in [("0", seq) for seq in range(5)]
                if (site := call_site(found.get(key))) is not None}

    assert sites(modern) == sites(mixed) == {("0", 1): "train.py:10", ("0", 2): "train.py:20",
                                             ("0", 3): "train.py:30"}
    assert sites(modern, p2p=True) == sites(mixed, p2p=True) == {("0", 1): "pipe.py:5"}
