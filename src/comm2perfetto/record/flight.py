"""Flight Recorder: make sure it records enough, and save every rank's ring buffer often enough.

Flight Recorder (FR) sees every collective, including the ones DDP and FSDP issue from C++, but keeps only
the last N entries in a ring. The recorder asks for a large ring before the process group exists (the
environment is read when it is created) and dumps the ring:

- whenever the groups' sequence counters say half a ring of new entries has accumulated (checked at step
  boundaries, at most once per microsecond of half a ring, and by the watchdog every second), so consecutive
  dumps overlap and nothing is dropped;
- at exit, on an uncaught exception, on SIGTERM/SIGINT, before ``destroy_process_group`` and at a stall.

Dumps are written to a temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from comm2perfetto import layout
from comm2perfetto.record import capture

if TYPE_CHECKING:
    from comm2perfetto.record.view import RankLog

BUFFER_ENV_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
DUMP_PREFIX_ENV_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


TIMING_ENV_VAR = "TORCH_NCCL_ENABLE_TIMING"
DUMP_ON_TIMEOUT_ENV_VAR = "TORCH_NCCL_DUMP_ON_TIMEOUT"
# Torch's ring size when no variable sets it: 2000 entries from torch 2.11 on, none (Flight Recorder off) before
# (flight_recorder_off_by_default).
TORCH_DEFAULT_RING = 2000
GROUP_UNUSED_NS = 30 * 10**9  # see FlightRecorderDumps.groups_settled
USED_AGE_NS = 10**6


def prepare_environment(env: dict[str, str] | os._Environ, wanted: int, out_dir: str, gpu_timing: bool = True,
                        group_exists: bool = False) -> list[str]:
    """Set FR's environment in ``env`` before any process group exists. Returns warnings for the user.

    The user's own buffer size is kept when it is at least ``wanted``; a smaller one is raised, with a
    warning, because dumps every half ring rely on it. Torch's own timeout dumps are switched on
    (``TORCH_NCCL_DUMP_ON_TIMEOUT``, off by default on older torch) and pointed at ``out_dir`` unless the user
    chose otherwise. With ``gpu_timing``, NCCL collectives are timed with CUDA events
    (``TORCH_NCCL_ENABLE_TIMING``: Flight Recorder then has each entry's ``duration_ms`` and start), unless the
    user set that variable.

    ``group_exists``: a process group was created already (``enable()`` after ``init_process_group``), so
    Flight Recorder's ring has its size (read once, when its singleton is made at the first group): the buffer
    variables are left alone and a warning says what ring is in effect (``ring_in_effect``).
    """
    warnings = []
    if group_exists:
        ring = ring_in_effect(env)
        if ring < wanted:
            warnings.append(
                f"recording started after init_process_group: Flight Recorder's ring holds {ring} entries, the "
                f"size set when the first process group was created"
                + (" (Flight Recorder is off: collectives issued from C++, such as DDP's and FSDP's, will be "
                   "missing)" if ring == 0 else "")
                + f"; call comm2perfetto.enable() before init_process_group for {wanted}")
    else:
        user_value = next((env[k] for k in BUFFER_ENV_VARS if env.get(k)), None)
        if user_value is not None:
            try:
                size = int(user_value)
            except ValueError:
                size = 0
            if size < wanted:
                warnings.append(
                    f"raising the Flight Recorder buffer from {user_value} to {wanted} entries "
                    f"(TORCH_FR_BUFFER_SIZE) so that no entry is dropped between dumps"
                )
            else:
                wanted = size
        # Torch >= 2.8 reads the TORCH_FR_* names and warns about the NCCL ones (kept in step where the user
        # set them).
        for key in BUFFER_ENV_VARS:
            if key == BUFFER_ENV_VARS[0] or key in env:
                env[key] = str(wanted)
    if not any(env.get(k) for k in DUMP_PREFIX_ENV_VARS):
        env[DUMP_PREFIX_ENV_VARS[0]] = os.path.join(os.path.abspath(out_dir), layout.TORCH_DUMP_PREFIX)
    env.setdefault(DUMP_ON_TIMEOUT_ENV_VAR, "1")
    if gpu_timing:
        env.setdefault(TIMING_ENV_VAR, "1")
    return warnings


def follow_attempt(env: dict[str, str] | os._Environ, out_dir: str, attempt_dir: str) -> None:
    """Point torch's own timeout dumps at this attempt's folder when they went to the recording folder (the
    launcher set that before torchrun started any attempt); torch reads the prefix at its first dump."""
    ours = os.path.join(os.path.abspath(out_dir), layout.TORCH_DUMP_PREFIX)
    for key in DUMP_PREFIX_ENV_VARS:
        if env.get(key) == ours:
            env[key] = os.path.join(os.path.abspath(attempt_dir), layout.TORCH_DUMP_PREFIX)


def ring_in_effect(env: dict[str, str] | os._Environ) -> int:
    """The Flight Recorder ring size torch took from ``env`` (its default when no variable is set)."""
    for key in BUFFER_ENV_VARS:
        value = env.get(key)
        if value:
            try:
                return max(int(value), 0)
            except ValueError:
                return 0
    return 0 if flight_recorder_off_by_default() else TORCH_DEFAULT_RING


def flight_recorder_off_by_default(version: str | None = None) -> bool:
    """Torch 2.8 to 2.10 record nothing unless ``TORCH_FR_BUFFER_SIZE`` is set when the first process group is
    created (seen on 2.8 with gloo: set afterwards, the ring stays empty); 2.11 and later record by default."""
    release = _release(_installed_torch() if version is None else version)
    return release is not None and release < (2, 11)


def _installed_torch() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


def _release(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a torch version such as ``2.13.0+cu130`` or ``2.9.0a0+git1234``."""
    try:
        major, minor = (version or "").split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


@contextmanager
def no_inductor_import_on_this_thread() -> Iterator[None]:
    """While a dump symbolises its entries' Python frames, ``torch._inductor`` cannot be imported by this thread.

    Torch's symboliser (torch/csrc/profiler/python/combined_traceback.cpp, ``appendSymbolized``) asks
    ``hasattr(torch, "_inductor")`` to find inductor's code cache; when the job has not imported inductor, torch's
    module ``__getattr__`` imports it: some 800 modules, 1.2 to 2 s holding the GIL, and if the job's main
    thread imports ``torch._dynamo`` meanwhile (DDP's constructor does) the two imports deadlock-break each
    other and the job dies with ``ImportError: cannot import name 'IndentedBuffer' from partially initialized
    module 'torch._inductor.utils'``.

    For the dumping thread alone, torch's ``__getattr__`` answers ``AttributeError`` for ``_inductor``: frames
    are symbolised without inductor's extra frames, which only code inductor generated has. Every other thread
    still reaches torch's own ``__getattr__``, so a concurrent import behaves exactly as without the recorder
    (a stand-in module in ``sys.modules``, tried before, changed what other threads saw). Once the job has
    imported inductor, ``torch._inductor`` is a plain attribute and torch uses its code cache as usual.
    """
    import torch

    lazy = vars(torch).get("__getattr__")
    if lazy is None or "_inductor" in vars(torch):
        yield
        return
    dumper = threading.get_ident()

    def guarded(name: str) -> object:
        if name == "_inductor" and threading.get_ident() == dumper:
            raise AttributeError(name)
        return lazy(name)

    torch.__getattr__ = guarded
    try:
        yield
    finally:
        if vars(torch).get("__getattr__") is guarded:
            torch.__getattr__ = lazy


class PendingOp(NamedTuple):
    """The first unfinished operation of one counter of one group, as Flight Recorder's entries show it."""

    seq: int
    since_ns: int  # since when it is known unfinished (FlightRecorderDumps.since); 0 from nccl_unfinished
    name: str  # its profiling name: ``nccl:all_reduce``, ``nccl:send 0->1`` (a batch: its first op)
    group: str  # process group name
    desc: str  # process group description


def nccl_unfinished(entries: list[dict[str, Any]]) -> dict[tuple[str, str], PendingOp]:
    """The first unfinished operation per (pg_id, "coll" or "p2p") among NCCL Flight Recorder entries (a whole
    ring, in record order).

    A coalesced group is one operation whose state is its closing ``*coalesced`` entry's: the entries of its
    ops have no CUDA events and stay ``scheduled``, never retired (torch 2.11, NCCL 2.28, seen on an H200).
    The closing entry of a ``batch_isend_irecv`` shares its ops' ``p2p_seq_id`` but says ``is_p2p: false`` and
    repeats the last collective's ``collective_seq_id``; a coalesced collective's shares its ops'
    ``collective_seq_id``::

        {"record_id": 3, "pg_id": 0, "profiling_name": "nccl:send 0->0", "is_p2p": true, "p2p_seq_id": 1,
         "collective_seq_id": 3, "state": "scheduled", "retired": false}
        {"record_id": 4, "pg_id": 0, "profiling_name": "nccl:recv 0<-0", "is_p2p": true, "p2p_seq_id": 1, ...}
        {"record_id": 5, "pg_id": 0, "profiling_name": "nccl:coalesced", "is_p2p": false, "p2p_seq_id": 1,
         "collective_seq_id": 3, "state": "completed", "retired": true}

    >>> op = {"pg_id": 0, "process_group": ("0", "default_pg"), "collective_seq_id": 3, "p2p_seq_id": 1}
    >>> nccl_unfinished([dict(op, profiling_name="nccl:send 0->1", is_p2p=True, state="scheduled"),
    ...                  dict(op, profiling_name="nccl:coalesced", is_p2p=False, state="completed")])
    {}
    >>> nccl_unfinished([dict(op, profiling_name="nccl:send 0->1", is_p2p=True, state="scheduled"),
    ...                  dict(op, profiling_name="nccl:coalesced", is_p2p=False, state="scheduled")])
    {('0', 'p2p'): PendingOp(seq=1, since_ns=0, name='nccl:send 0->1', group='0', desc='default_pg')}
    """
    closed: set[int] = set()  # indices of ops that a closing entry stands for
    units: list[tuple[dict[str, Any], str, int, str]] = []  # (entry, counter, seq, name), newest first
    for i in range(len(entries) - 1, -1, -1):
        if i in closed:
            continue
        e = entries[i]
        name = str(e.get("profiling_name") or "")
        p2p = bool(e.get("is_p2p"))
        seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
        if not p2p and name.endswith("coalesced"):
            members = _closed_by(entries, i)
            if members:
                closed.update(members)
                first = entries[members[-1]]
                p2p = bool(first.get("is_p2p"))
                seq = e.get("p2p_seq_id" if p2p else "collective_seq_id")
                if name.partition(":")[2] == "coalesced":
                    name = str(first.get("profiling_name") or name)
        if isinstance(seq, int):
            units.append((e, "p2p" if p2p else "coll", seq, name))
    out: dict[tuple[str, str], PendingOp] = {}
    for e, counter, seq, name in units:
        if e.get("state") == "completed" or e.get("retired"):
            continue
        key = (str(e.get("pg_id")), counter)
        if key not in out or seq < out[key].seq:
            group = e.get("process_group") or ("?", "")
            out[key] = PendingOp(seq, 0, name, str(group[0]), str(group[1] or ""))
    return out


def _closed_by(entries: list[dict[str, Any]], closing: int) -> list[int]:
    """Indices (newest first) of the ops the closing entry at ``closing`` stands for: the entries of its group
    right before it with its p2p sequence number (a batched send/recv) or its collective one."""
    c = entries[closing]
    pg = c.get("pg_id")
    members: list[int] = []
    p2p: bool | None = None
    for j in range(closing - 1, -1, -1):
        e = entries[j]
        if e.get("pg_id") != pg:
            continue  # another thread's group, recorded in between
        is_p2p = bool(e.get("is_p2p"))
        if p2p is None:
            p2p = is_p2p
        field = "p2p_seq_id" if p2p else "collective_seq_id"
        if is_p2p != p2p or e.get(field) != c.get(field) or str(e.get("profiling_name")).endswith("coalesced"):
            break
        members.append(j)
    return members


class FlightRecorderDumps:
    """Writes ``rank<R>.fr.<n>.pkl`` (and ``rank<R>.fr-nccl.<n>.pkl`` when a group uses NCCL) into the output
    folder."""

    def __init__(self, recorder: RankLog, out_dir: str, buffer_size: int) -> None:
        import torch._C._distributed_c10d as c10d_C
        import torch.distributed.distributed_c10d as c10d

        self._recorder = recorder
        self._out_dir = out_dir
        self._buffer_size = buffer_size
        self._generic = getattr(c10d_C, "_dump_fr_trace", None)
        self._nccl = getattr(c10d_C, "_dump_nccl_trace", None)
        self._generic_json = getattr(c10d_C, "_dump_fr_trace_json", None)
        self._nccl_json = getattr(c10d_C, "_dump_nccl_trace_json", None)
        self._lock = threading.Lock()
        self._count = 0
        self._issued_at_last_dump = 0
        self._c10d = c10d
        self._counters_key: tuple[int, int | None] | None = None
        self._counters: list[Callable[[], int]] = []
        # No process issues a collective per microsecond (each passes c10d's dispatch, several us of CPU): in
        # half a ring's worth of microseconds (10 ms for the default 20,000) less than half a ring accumulates.
        self._step_check_ns = buffer_size // 2 * 1000
        self._next_step_check_ns = 0
        self._clock = time.monotonic_ns
        self.p2p_issued = 0  # point-to-point ops on GPUs (recorder.py counts them): ring slots no counter shows
        self._groups_seen: tuple[int, int | None] | None = None  # see groups_settled
        self._groups_since_ns = 0
        self._used_since_ns: int | None = None
        self._fewest_collectives = 0
        # NCCL's unfinished operations (see unfinished): the fingerprint of the groups' status and when it last
        # changed, the one the entries were last read for and when, and what they showed unfinished then.
        self._wall_clock = time.time_ns
        self._nccl_fingerprint: tuple | None = None
        self._nccl_still_since = 0
        self._nccl_read_for: tuple | None = None
        self._nccl_read_at = 0
        self._nccl_pending: dict[tuple[str, str], PendingOp] = {}

    def dump(self, reason: str, wait: bool = True) -> None:
        """Write the ring to new files. ``wait=False`` (signal handlers) skips the dump when one is already
        being written, possibly by the very thread the handler interrupted."""
        if capture.active:  # a dump queries CUDA events: that would invalidate the capture
            self._recorder.warn(f"Flight Recorder {reason} dump skipped: a CUDA graph capture was in progress")
            return
        if not self._lock.acquire(blocking=wait):
            self._recorder.warn(f"Flight Recorder {reason} dump skipped: another dump was in progress")
            return
        try:
            self._dump_locked(reason)
        finally:
            self._lock.release()

    def busy(self) -> bool:
        return self._lock.locked()

    def _dump_locked(self, reason: str) -> None:
        self._issued_at_last_dump = self._issued()
        self._count += 1
        rank = self._recorder.rank
        nccl_used = self._nccl is not None and self._uses_nccl()
        # A periodic dump keeps entries the ring will drop, without their Python stacks: symbolising a full
        # ring holds the GIL (some 250 ms for 20,000 entries: the dump binding does not release it). Dumps at a
        # stall, signal, exception or exit carry the stacks of what matters then.
        stacks = reason != "periodic"
        for dumper, kind in ((self._generic, "fr"), (self._nccl if nccl_used else None, "fr-nccl")):
            if dumper is None:
                continue
            try:
                with no_inductor_import_on_this_thread():
                    data = dumper(True, stacks)
            except Exception as exc:  # e.g. NCCL dump on a build whose NCCL is unused
                self._recorder.warn(f"Flight Recorder {kind} dump failed: {type(exc).__name__}: {exc}")
                continue
            name = layout.fr_dump(rank, kind, self._count)
            layout.write_whole(os.path.join(self._out_dir, name), data)
            self._recorder.log.write(["f", time.time_ns(), name, reason])

    def release_groups(self) -> None:
        self._counters, self._counters_key = [], None
        self._groups_seen = self._used_since_ns = None

    def _uses_nccl(self) -> bool:
        """Whether any of the job's groups has an NCCL backend. A CUDA build run without a GPU (gloo) has an
        NCCL Flight Recorder too, whose every dump is empty: not worth a file."""
        c10d = self._c10d
        for group in list(c10d._world.pg_map):
            try:
                if "nccl" in str(c10d.get_backend_config(group)):
                    return True
            except Exception:  # a group destroyed meanwhile
                continue
        return False

    def unfinished(self, quiet_ns: int = 0) -> dict[tuple[str, str, str], int] | None:
        """The first operation each group has enqueued but not completed, per counter: {(dump kind, pg_id,
        "coll" or "p2p"): sequence number}. Sees what is issued from C++ (DDP, FSDP), which never passes through
        the patch layer. Returns None while the job's groups may still change (``groups_settled``): nothing is
        known then. The watchdog calls it every tick, so each call costs microseconds whatever the ring holds.

        Gloo (the generic dump): ``pg_status``, which gloo keeps for collectives only (its send/recv do not go
        through ``enqueue``) and current (seen on 2.13) although its entries stay ``scheduled``::

            {"version": "2.10", "pg_status": {"0": {"last_enqueued_collective": "2",
             "last_started_collective": "-1", "last_completed_collective": "1"}}, ...}

        NCCL: its ``pg_status`` follows ``work->seq_``, the p2p counter for send/recv work and the collective
        counter otherwise (ProcessGroupNCCL.cpp, ``workEnqueue``), so it cannot say which operation is
        unfinished; and its "only active" entries include every op of every batched send/recv in the ring
        (they have no CUDA events: never completed, never retired), so reading them each second cost up to half
        a second on a pipeline's ring (13,333 such entries, H200, torch 2.11). So the status is only watched
        here, as a fingerprint (with the groups' issued counters), and the entries are read
        (``nccl_unfinished``) once the fingerprint has stood still for ``quiet_ns``: nothing enqueued, started
        or completed on any group for that long. What they show unfinished then was unfinished since the
        fingerprint last changed (``since``). While that view names something, a change of fingerprint has
        the entries read again, at most every ``quiet_ns / 4``, to see it complete.
        """
        if not self.groups_settled():
            return None
        out: dict[tuple[str, str, str], int] = {}
        generic = self._generic_json
        if generic is not None:
            try:
                status = orjson.loads(generic(False)).get("pg_status") or {}
            except Exception:  # an older signature
                status = {}
            for pg_id, st in status.items():
                enqueued = int(st.get("last_enqueued_collective", -1))
                completed = int(st.get("last_completed_collective", -1))
                if enqueued > completed:
                    out[("fr", pg_id, "coll")] = completed + 1
        if self._nccl_json is not None and self._uses_nccl():
            for (pg_id, counter), pending in self._nccl_view(quiet_ns).items():
                out[("fr-nccl", pg_id, counter)] = pending.seq
        return out

    def since(self, key: tuple[str, str, str], seq: int) -> int | None:
        """Since when (``time.time_ns()``) the operation ``unfinished()`` gave for ``key`` is known unfinished,
        where the dump tells more than the moment the watchdog first saw it (NCCL); else None."""
        pending = self._nccl_pending.get(key[1:]) if key[0] == "fr-nccl" else None
        return pending.since_ns if pending is not None and pending.seq == seq else None

    def _nccl_view(self, quiet_ns: int) -> dict[tuple[str, str], PendingOp]:
        """What the NCCL entries showed unfinished, read again only when ``unfinished`` says so."""
        status_dump, ring_dump = self._nccl_json, self._nccl
        if status_dump is None or ring_dump is None:
            return {}
        now = self._wall_clock()
        try:
            status = status_dump(False, False)  # pg_config and pg_status only: no entry is copied
        except Exception:
            status = None
        fingerprint = (status, self._issued())
        if fingerprint != self._nccl_fingerprint:
            self._nccl_fingerprint, self._nccl_still_since = fingerprint, now
        if fingerprint != self._nccl_read_for and (
                now - self._nccl_still_since >= quiet_ns
                or (self._nccl_pending and now - self._nccl_read_at >= quiet_ns // 4)):
            self._nccl_read_for, self._nccl_read_at = fingerprint, now
            try:
                entries = pickle.loads(ring_dump(True, False, False)).get("entries") or []
            except Exception:  # torch's own dump of this process: only a changed signature fails here
                entries = []
            old = self._nccl_pending
            self._nccl_pending = {
                key: p._replace(since_ns=old[key].since_ns if key in old and old[key].seq == p.seq
                                else self._nccl_still_since)
                for key, p in nccl_unfinished(entries).items()}
        return self._nccl_pending

    def _active_entries(self, kind: str) -> list[dict]:
        dumper = self._generic_json if kind == "fr" else self._nccl_json
        if dumper is None:  # a torch without that dump
            return []
        try:
            return orjson.loads(dumper(True, True)).get("entries", [])
        except Exception:
            return []

    def active_entry(self, kind: str, pg_id: str, seq: int, counter: str = "coll") -> tuple[str, str, str] | None:
        """(profiling name, group name, group description) of one unfinished entry, or None; best effort. On
        NCCL, from the entries ``unfinished`` read last."""
        if kind == "fr-nccl":
            pending = self._nccl_pending.get((pg_id, counter))
            return pending[2:] if pending is not None and pending.seq == seq else None
        field = "p2p_seq_id" if counter == "p2p" else "collective_seq_id"
        for entry in self._active_entries(kind):
            if str(entry.get("pg_id")) == pg_id and entry.get(field) == seq \
                    and bool(entry.get("is_p2p")) == (counter == "p2p"):
                group = entry.get("process_group") or ["?", ""]
                return str(entry.get("profiling_name", "?")), str(group[0]), str(group[1] or "")
        return None

    def groups_settled(self, unused_ns: int = GROUP_UNUSED_NS) -> bool:
        """Whether Flight Recorder's group maps can be read now. Its JSON and pickle dumps iterate
        ``all_pg_status_`` and ``pg_name_to_ranks_`` without the lock that ``record()`` and
        ``record_pg_ranks()`` take to insert into them (FlightRecorderDetail.hpp): an insertion meanwhile (a
        group being created, or recording its first operation) can crash the process. Torch itself reads them
        only at a timeout. So the watchdog's reads and the periodic dumps wait until the set of groups is
        unchanged and each group's first record is over: every group has issued two collectives (the second is
        recorded after the first), or had issued one ``USED_AGE_NS`` ago (a record takes microseconds), or the
        set has not changed for ``unused_ns`` (a group used only for send/recv shows no collective count)."""
        self._issued()  # looks at the groups and their counters (see _observe)
        now = self._clock()
        if self._fewest_collectives >= 2 or now - self._groups_since_ns >= unused_ns:
            return True
        return self._used_since_ns is not None and now - self._used_since_ns >= USED_AGE_NS

    def _observe(self, key: tuple[int, int | None], fewest: int) -> None:
        """Note what ``_issued`` saw: which groups exist, the fewest collectives one of them has issued, and
        since when every one has issued one."""
        now = self._clock()
        if key != self._groups_seen:
            self._groups_seen, self._groups_since_ns, self._used_since_ns = key, now, None
        self._fewest_collectives = fewest
        if fewest < 1:
            self._used_since_ns = None
        elif self._used_since_ns is None:
            self._used_since_ns = now

    def at_step(self, _step: int) -> None:
        """``maybe_dump`` at a step boundary, at most once per ``_step_check_ns``. Right after an optimizer step
        the caches are cold and reading the groups' counters costs 5 us, a third of a 1.5 ms step's recording
        cost; steps shorter than the interval skip it, and still no entry is dropped."""
        now = self._clock()
        if now >= self._next_step_check_ns:
            self._next_step_check_ns = now + self._step_check_ns
            self.maybe_dump()

    def maybe_dump(self) -> None:
        """Dump when about half a ring of entries accumulated since the last dump (never with no ring), once
        the groups have settled (``groups_settled``; with half a ring left, a short wait loses nothing)."""
        if self._buffer_size > 0 and self._issued() - self._issued_at_last_dump >= self._buffer_size // 2 \
                and self.groups_settled():
            self.dump("periodic")

    def _issued(self) -> int:
        """Ring slots taken so far: the collectives issued on every group this rank has seen (C++-issued ones
        included) plus the point-to-point ops on GPUs the patch layer counted (each takes a slot; the
        collective counters do not count them). Runs at every step boundary: the groups' counters are looked
        up again only when groups come or go."""
        world = self._c10d._world
        key = (len(world.pg_map), getattr(world, "group_count", None))
        if key != self._counters_key or key[1] is None:
            self._counters_key = key
            self._counters = [counter for group in list(world.pg_map)
                              if (counter := getattr(group, "_get_sequence_number_for_group", None)) is not None]
        total = self.p2p_issued
        fewest = None
        for counter in self._counters:
            try:
                n = counter()
            except Exception:  # a backend without the counter, a group destroyed meanwhile
                fewest = 0
                continue
            total += n
            fewest = n if fewest is None else min(fewest, n)
        self._observe(key, fewest or 0)
        return total
