"""Flight Recorder's environment: a large enough ring, dumps pointed at the output folder."""

from __future__ import annotations

import os
from typing import ClassVar

import pytest

from comm2perfetto.record.flight import prepare_environment, ring_in_effect


def test_sets_the_buffer_and_dump_place_when_the_user_did_not(tmp_path):
    env: dict[str, str] = {}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env == {"TORCH_FR_BUFFER_SIZE": "20000",
                   "TORCH_FR_DUMP_TEMP_FILE": os.path.join(str(tmp_path), "torch_fr_rank_"),
                   # torch's own dump at an NCCL timeout (off by default before 2.6), into the folder
                   "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   # CUDA-event timing of NCCL collectives: Flight Recorder's duration_ms
                   "TORCH_NCCL_ENABLE_TIMING": "1"}


def test_keeps_the_users_nccl_settings_and_can_leave_timing_off(tmp_path):
    env = {"TORCH_NCCL_ENABLE_TIMING": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}
    prepare_environment(env, 20000, str(tmp_path))
    assert (env["TORCH_NCCL_ENABLE_TIMING"], env["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("0", "0")
    env = {}
    prepare_environment(env, 20000, str(tmp_path), gpu_timing=False)
    assert "TORCH_NCCL_ENABLE_TIMING" not in env


@pytest.mark.parametrize("env, ring", [
    ({"TORCH_FR_BUFFER_SIZE": "5000"}, 5000), ({"TORCH_NCCL_TRACE_BUFFER_SIZE": "300"}, 300),
    ({"TORCH_FR_BUFFER_SIZE": "many"}, 0), ({}, 2000),  # torch 2.13's own default
])
def test_after_the_first_group_the_ring_in_effect_is_said_and_left_alone(tmp_path, env, ring):
    """Flight Recorder reads its size once, when its singleton is made at the first process group
    (torch/csrc/distributed/c10d/FlightRecorder.hpp, ``FlightRecorder::get``): enable() after
    init_process_group cannot change it, and must not claim to."""
    before = dict(env)
    warnings = prepare_environment(env, 20000, str(tmp_path), group_exists=True)
    assert ring_in_effect(env) == ring
    assert {k: env.get(k) for k in before} == before  # the buffer variables are untouched
    (warning,) = warnings
    assert f"Flight Recorder's ring holds {ring} entries" in warning and "raising" not in warning
    assert ("Flight Recorder is off" in warning) == (ring == 0)


def test_after_the_first_group_a_large_enough_ring_needs_no_warning(tmp_path):
    assert prepare_environment({"TORCH_FR_BUFFER_SIZE": "50000"}, 20000, str(tmp_path), group_exists=True) == []


def test_keeps_a_larger_user_buffer(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "50000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    assert env["TORCH_FR_BUFFER_SIZE"] == "50000"


def test_keeps_a_larger_user_buffer_given_by_its_nccl_name(tmp_path):
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "40000"}
    assert prepare_environment(env, 20000, str(tmp_path)) == []
    # Both names then agree, whichever one this torch reads.
    assert env["TORCH_FR_BUFFER_SIZE"] == env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "40000"


def test_raises_a_smaller_user_buffer_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "100"}
    warnings = prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"
    assert warnings == [("raising the Flight Recorder buffer from 100 to 20000 entries (TORCH_FR_BUFFER_SIZE) "
                         "so that no entry is dropped between dumps")]


def test_an_unreadable_user_buffer_is_replaced_with_a_warning(tmp_path):
    env = {"TORCH_FR_BUFFER_SIZE": "lots"}
    (warning,) = prepare_environment(env, 20000, str(tmp_path))
    assert "from lots to 20000" in warning
    assert env["TORCH_FR_BUFFER_SIZE"] == "20000"


def test_keeps_the_users_dump_place(tmp_path):
    env = {"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/scratch/fr_"}
    prepare_environment(env, 20000, str(tmp_path))
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "/scratch/fr_"
    assert "TORCH_FR_DUMP_TEMP_FILE" not in env


class _Clock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns


def _dumps_checked_at_steps(buffer_size: int, step_ns: int, steps: int) -> int:
    """How many of ``steps`` step boundaries, ``step_ns`` apart, check whether a dump is due."""
    from comm2perfetto.record.flight import FlightRecorderDumps

    dumps = FlightRecorderDumps(recorder=None, out_dir=".", buffer_size=buffer_size)
    dumps._clock = clock = _Clock()
    checks = []
    dumps.maybe_dump = lambda: checks.append(clock.ns)
    for step in range(steps):
        clock.ns = step * step_ns
        dumps.at_step(step)
    return len(checks)


def test_step_boundaries_check_at_most_once_per_half_ring_of_microseconds():
    # The default ring: 10,000 entries cannot accumulate in 10 ms. 1 ms steps check every tenth step.
    assert _dumps_checked_at_steps(20000, 1_000_000, 100) == 10
    assert _dumps_checked_at_steps(20000, 20_000_000, 10) == 10  # slow steps: every one
    # A 16-entry ring: 8 us, so every step of a real job.
    assert _dumps_checked_at_steps(16, 1_000_000, 50) == 50


GUARD_CHECK = """
import sys, threading
import torch
from comm2perfetto.record.flight import no_inductor_import_on_this_thread

lazy = torch.__getattr__
assert "torch._inductor" not in sys.modules
seen = {}
with no_inductor_import_on_this_thread():
    seen["dumping thread"] = hasattr(torch, "_inductor")
    other = threading.Thread(target=lambda: seen.__setitem__("other thread", type(torch._inductor).__name__))
    other.start()
    other.join()
print(seen, torch.__getattr__ is lazy, "_inductor" in vars(torch))
"""


def test_only_the_dumping_thread_is_kept_from_importing_inductor():
    """Torch's symboliser asks ``hasattr(torch, "_inductor")``: the dumping thread gets False without an import;
    another thread meanwhile imports inductor exactly as without the recorder; torch is left as it was."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", GUARD_CHECK], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["{'dumping", "thread':", "False,", "'other", "thread':", "'module'}", "True",
                                   "True"]


@pytest.mark.parametrize("version", ["2.4.1", "2.7.1+cu126", "1.13.1"])
def test_torch_without_a_gloo_flight_recorder_is_refused_in_one_line(version):
    from comm2perfetto.record.flight import unsupported_torch

    reason = unsupported_torch(version)
    assert reason is not None and "\n" not in reason
    assert reason.startswith(f"comm2perfetto record needs torch >= 2.8, found {version}: ")


@pytest.mark.parametrize("version", ["2.8.0", "2.13.0+cpu", "2.10.0+cu128", "2.14.0a0+git1234", "", "nightly"])
def test_torch_from_2_8_or_unreadable_is_recorded(version):
    from comm2perfetto.record.flight import unsupported_torch

    assert unsupported_torch(version) is None


def test_record_refuses_an_older_torch_before_starting_the_job(tmp_path, monkeypatch, capsys):
    from comm2perfetto.cli import main
    from comm2perfetto.record import flight

    monkeypatch.setattr(flight, "_installed_torch", lambda: "2.6.0+cu124")
    marker = tmp_path / "job-ran"
    assert main(["record", "-o", str(tmp_path / "out"), "--", "touch", str(marker)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs torch >= 2.8, found 2.6.0+cu124" in err
    assert not marker.exists()


@pytest.mark.parametrize(("version", "off"), [("2.8.0+cu128", True), ("2.10.0", True), ("2.11.0", False),
                                              ("2.13.0+cpu", False), ("unknown", False)])
def test_which_torch_needs_the_buffer_size_before_the_first_group(version, off):
    from comm2perfetto.record.flight import flight_recorder_off_by_default

    assert flight_recorder_off_by_default(version) is off


# --- what the watchdog reads of Flight Recorder, and when (shapes from torch 2.13's sources) ----------------


class _World:
    def __init__(self, groups: list) -> None:
        self.pg_map = {g: None for g in groups}
        self.group_count = len(groups)


class _Group:
    def __init__(self, collectives: int) -> None:
        self.collectives = collectives

    def _get_sequence_number_for_group(self) -> int:
        return self.collectives


class _C10d:
    def __init__(self, groups: list) -> None:
        self._world = _World(groups)

    def get_backend_config(self, group) -> str:
        return "cuda:nccl"


def _dumps(groups: list, buffer_size: int = 20000):
    from comm2perfetto.record.flight import FlightRecorderDumps

    dumps = FlightRecorderDumps(recorder=None, out_dir=".", buffer_size=buffer_size)
    dumps._c10d = _C10d(groups)
    dumps._clock = clock = _Clock()
    return dumps, clock


def _settle(dumps, clock) -> None:
    dumps.groups_settled()
    clock.ns += 31 * 10**9


class _NcclRing:
    """Flight Recorder's two NCCL dump functions over a list of entries: the JSON one as the watchdog calls it
    each tick (``includeCollectives=False``: pg_config and pg_status only), the pickle one for whole rings.
    Counts the whole-ring reads."""

    def __init__(self, entries: list, pg_status: dict) -> None:
        self.entries, self.pg_status, self.ring_reads = entries, pg_status, 0

    def json(self, include_collectives=True, only_active=False):
        import orjson

        assert not include_collectives  # the per-tick read copies no entry
        return orjson.dumps({"version": "2.10", "pg_status": self.pg_status})

    def pickle(self, include_collectives=True, include_stacks=True, only_active=False):
        import pickle

        assert include_collectives and not include_stacks and not only_active
        self.ring_reads += 1
        return pickle.dumps({"version": "2.10", "pg_status": self.pg_status, "entries": self.entries})


def _entry(record_id: int, name: str, seq: int, p2p_seq: int = 0, state: str = "scheduled", pg: int = 0,
           is_p2p: bool | None = None) -> dict:
    return {"record_id": record_id, "pg_id": pg, "process_group": (str(pg), "default_pg" if pg == 0 else "pp"),
            "profiling_name": name, "collective_seq_id": seq, "p2p_seq_id": p2p_seq,
            "is_p2p": (" " in name) if is_p2p is None else is_p2p, "state": state,
            "retired": state == "completed"}


def _nccl_dumps(ring: _NcclRing, groups: list):
    dumps, clock = _dumps(groups)
    dumps._generic_json = None
    dumps._nccl_json, dumps._nccl = ring.json, ring.pickle
    dumps._wall_clock = clock  # one fake clock for both: only differences matter
    return dumps, clock


def test_nccl_unfinished_work_is_read_per_counter_once_the_groups_stood_still():
    """NCCL's pg_status follows work->seq_, the p2p counter for send/recv (ProcessGroupNCCL.cpp, workEnqueue:
    ``pgStatus_->lastEnqueuedSeq = work->seq_``): it cannot say what is unfinished; the entries can, per
    counter. They are read only once the groups' status and counters stood still for the stall threshold, and
    what was unfinished then dates from when they last changed."""
    s = 10**9
    ring = _NcclRing([_entry(0, "nccl:all_reduce", 4, state="completed"), _entry(1, "nccl:all_reduce", 5),
                      _entry(2, "nccl:send 0->1", 5, p2p_seq=130, state="started"),
                      _entry(3, "nccl:recv 1<-0", 0, p2p_seq=9, pg=1)],
                     {"0": {"last_enqueued_collective": "130", "last_started_collective": "-1",
                            "last_completed_collective": "129"}})
    group = _Group(1)  # its first collective: its first record may still be inserting
    dumps, clock = _nccl_dumps(ring, [group])
    assert dumps.unfinished(2 * s) is None  # the groups just appeared: Flight Recorder is not read yet
    _settle(dumps, clock)
    changed_at = clock.ns
    assert dumps.unfinished(2 * s) == {}  # the status may be moving: no whole-ring read yet
    clock.ns += s
    assert dumps.unfinished(2 * s) == {} and ring.ring_reads == 0
    clock.ns += s  # two seconds without a change
    assert dumps.unfinished(2 * s) == {("fr-nccl", "0", "coll"): 5, ("fr-nccl", "0", "p2p"): 130,
                                       ("fr-nccl", "1", "p2p"): 9}
    assert dumps.since(("fr-nccl", "0", "coll"), 5) == changed_at
    assert dumps.since(("fr-nccl", "0", "coll"), 4) is None
    assert dumps.active_entry("fr-nccl", "0", 130, "p2p") == ("nccl:send 0->1", "0", "default_pg")
    assert dumps.active_entry("fr-nccl", "0", 5) == ("nccl:all_reduce", "0", "default_pg")
    for _ in range(50):  # nothing changes: every later tick reads the status only
        clock.ns += s
        assert len(dumps.unfinished(2 * s)) == 3
    assert ring.ring_reads == 1
    status = ring.pg_status["0"]
    status["last_started_collective"] = "130"  # the status moves while something was unfinished: read again,
    assert len(dumps.unfinished(2 * s)) == 3 and ring.ring_reads == 2  # to see it complete
    for e in ring.entries:  # everything completes
        e["state"] = "completed"
    status["last_completed_collective"] = "130"
    clock.ns += s // 10
    assert len(dumps.unfinished(2 * s)) == 3  # ... but at most every quarter of the threshold
    clock.ns += s // 2
    assert dumps.unfinished(2 * s) == {} and ring.ring_reads == 3
    group.collectives += 1  # a new collective: the counters move even where the status would not yet
    clock.ns += 10 * s
    assert dumps.unfinished(2 * s) == {} and ring.ring_reads == 3  # nothing pending: no reason to read
    clock.ns += 2 * s
    assert dumps.unfinished(2 * s) == {} and ring.ring_reads == 4


def test_the_ops_of_a_batched_send_recv_are_done_when_their_closing_entry_is():
    """The entries of a batch_isend_irecv's ops stay scheduled and unretired for ever (no CUDA events); the
    closing ``nccl:coalesced`` entry (``is_p2p`` false, the last collective's seq, the batch's p2p seq) has the
    batch's state (seen on an H200, torch 2.11, NCCL 2.28: tests/data/nccl/)."""
    from comm2perfetto.record.flight import nccl_unfinished

    batch = [_entry(0, "nccl:all_reduce", 3, state="completed"), _entry(1, "nccl:send 0->1", 3, p2p_seq=1),
             _entry(2, "nccl:recv 0<-1", 3, p2p_seq=1), _entry(3, "nccl:coalesced", 3, p2p_seq=1, is_p2p=False)]
    assert nccl_unfinished(batch) == {("0", "p2p"): (1, 0, "nccl:send 0->1", "0", "default_pg")}
    batch[3].update(state="completed", retired=True)
    assert nccl_unfinished(batch) == {}
    # a coalesced collective (FSDP's all-gathers): ops of one collective seq, then the closing entry
    ring = batch + [_entry(4, "nccl:_allgather_base", 4), _entry(5, "nccl:_allgather_base", 4),
                    _entry(6, "nccl:ALLGATHER_coalesced", 4, p2p_seq=1, is_p2p=False, state="completed"),
                    _entry(7, "nccl:send 0->1", 4, p2p_seq=2), _entry(8, "nccl:all_reduce", 5)]
    assert nccl_unfinished(ring) == {("0", "p2p"): (2, 0, "nccl:send 0->1", "0", "default_pg"),
                                     ("0", "coll"): (5, 0, "nccl:all_reduce", "0", "default_pg")}
    ring[6].update(state="scheduled", retired=False)
    assert nccl_unfinished(ring)[("0", "coll")] == (4, 0, "nccl:ALLGATHER_coalesced", "0", "default_pg")


def test_flight_recorder_is_read_only_once_the_groups_have_settled():
    """FR's dumps iterate all_pg_status_ and pg_name_to_ranks_ without the lock record() and record_pg_ranks()
    take to insert into them (FlightRecorderDetail.hpp): not while groups are created or record their first
    operation."""
    ms = 10**6
    groups = [_Group(3), _Group(0)]
    dumps, clock = _dumps(groups)
    assert not dumps.groups_settled()  # first sight of these groups
    clock.ns += 5 * ms
    assert not dumps.groups_settled()  # group 2 has issued nothing: its first operation may come any moment
    groups[1].collectives = 1
    assert not dumps.groups_settled()  # it has now, but its first record may still be inserting
    clock.ns += ms
    assert dumps.groups_settled()  # seen used a millisecond ago: that record is over
    dumps._c10d._world = _World([_Group(2), _Group(5)])
    assert dumps.groups_settled()  # two collectives each: the second is recorded after the first
    dumps._c10d._world = _World([_Group(2), _Group(5), _Group(1)])  # a new group (DeviceMesh, new_group)
    assert not dumps.groups_settled()
    clock.ns += ms
    assert dumps.groups_settled()
    dumps._c10d._world = _World([_Group(0)])  # a group used for send/recv only: settled after 30 s
    dumps.groups_settled()
    clock.ns += 29 * 10**9
    assert not dumps.groups_settled()
    clock.ns += 10**9
    assert dumps.groups_settled()


def test_periodic_dumps_leave_stacks_out_and_count_point_to_point_slots(tmp_path):
    """Every send/recv takes a ring slot that no collective counter shows: with 128 p2p ops and 4 all_reduces a
    step (a pipeline), the schedule must count both or the ring wraps between dumps. Periodic dumps skip the
    Python stacks (symbolising holds the GIL); a stall's dump keeps them."""

    class _Rec:
        rank = 0

        class log:
            records: ClassVar[list] = []

            @classmethod
            def write(cls, r):
                cls.records.append(r)

    group = _Group(0)
    dumps, clock = _dumps([group], buffer_size=200)
    dumps._recorder = _Rec
    dumps._out_dir = str(tmp_path)
    asked = []
    dumps._generic = lambda collectives=True, stacks=True: asked.append(stacks) or b"dump"
    dumps._nccl = None
    _settle(dumps, clock)
    group.collectives = 4
    dumps.p2p_issued = 95
    dumps.maybe_dump()
    assert asked == []  # 99 of a 200-entry ring: not yet
    dumps.p2p_issued = 96
    dumps.maybe_dump()
    assert asked == [False]  # half a ring, counting send/recv: a periodic dump, without stacks
    dumps.dump("stall")
    assert asked == [False, True]
    assert [r[3] for r in _Rec.log.records] == ["periodic", "stall"]
