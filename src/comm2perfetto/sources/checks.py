"""Whether the files found are of one job: the mixed-job evidence of ``sources.read.load_sources`` (refused
unless ``--force``) and the world size the files state. Pure functions over what was read. Never imports torch.

Evidence of more than one job: event logs that disagree on the world size or share no identity field
(``JOB_IDENTITY_FIELDS``), dumps that disagree on the default group, or whose shared collectives were all
created far apart in time (``MIXED_GAP_NS``); profiler traces of another world size or months away
(``sources.kineto.load.check_against_job``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from comm2perfetto.sources.discover import SourceError
from comm2perfetto.sources.event_log import RankLog
from comm2perfetto.sources.fr.ingest import FrRankTrace
from comm2perfetto.sources.limits import Ranks
from comm2perfetto.words import duration

__all__ = ["JOB_IDENTITY_FIELDS", "MIXED_GAP_NS", "MixedJobsError", "check_fr_groups", "check_fr_times",
           "check_log_headers", "dumps_times", "dumps_world", "refuse_mixed", "same_job_components"]


class MixedJobsError(SourceError):
    """Files from more than one job in the folders given."""


def check_log_headers(logs: dict[int, RankLog], problems: list[str]) -> None:
    worlds = {log.header.get("world_size") for log in logs.values()}
    if len(worlds) > 1:
        problems.append(f"event logs disagree on world size ({sorted(map(str, worlds))})")
    jobs = same_job_components(logs)
    if len(jobs) > 1:
        runs = sorted({str(logs[min(ranks)].header.get("run_id")) for ranks in jobs})
        problems.append(f"event logs come from different runs ({', '.join(runs)})")


# Header fields every rank of one job shares, whichever node it ran on: the run id (the same on every node when
# COMM2PERFETTO_RUN_ID was set), torchrun's run id (--rdzv-id), the rendezvous endpoint MASTER_ADDR:PORT.
JOB_IDENTITY_FIELDS = ("run_id", "torchelastic_run_id", "master")


def same_job_components(logs: dict[int, RankLog]) -> list[set[int]]:
    """Ranks grouped into jobs: two logs are of one job when they share any identity field's value.

    One ``record`` per node writes a run id of its own, but the ranks of all nodes share torchrun's run id
    and the rendezvous endpoint; two separate runs share none of them (torchrun makes a new run id each time).
    """
    parent = {rank: rank for rank in logs}

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    owner: dict[tuple[str, str], int] = {}
    for rank, log in sorted(logs.items()):
        for key in JOB_IDENTITY_FIELDS:
            value = log.header.get(key)
            if not value or value == "none":
                continue
            other = owner.setdefault((key, str(value)), rank)
            parent[root(rank)] = root(other)
    groups: dict[int, set[int]] = defaultdict(set)
    for rank in logs:
        groups[root(rank)].add(rank)
    return list(groups.values())


# The ranks of one job issue a collective at nearly the same moment (a rank that arrives late at one makes the
# others wait, and they issue the next one together); dumps whose every shared collective lies this far apart
# in time on two ranks are of different runs.
MIXED_GAP_NS = 5 * 10**9
MIXED_TAIL = 64  # the latest collectives of each rank compared (enough, and cheap at 1024 ranks)


def check_fr_times(fr: Mapping[int, FrRankTrace], problems: list[str]) -> None:
    """Plain Flight Recorder dumps carry no job identity. Two ranks of one job create the same collective
    (group, seq) within its arrival skew at least some of the time; when every one of at least two shared
    collectives was created more than ``MIXED_GAP_NS`` apart, the dumps are of different runs (a single
    shared one may be a collective one rank hung in)."""
    reference: dict[tuple[str, str], tuple[int, dict[int, int]]] = {}
    for rank in sorted(fr):
        for key, gt in fr[rank].groups.items():
            times = {s: t for s, t in zip(gt.seq_col[-MIXED_TAIL:], gt.created_col[-MIXED_TAIL:]) if t > 0}
            if key not in reference:
                reference[key] = (rank, times)
                continue
            ref_rank, ref = reference[key]
            gaps = [abs(t - ref[s]) for s, t in times.items() if s in ref]
            if len(gaps) >= 2 and min(gaps) > MIXED_GAP_NS:
                problems.append(f"ranks {ref_rank} and {rank} issued the same collectives of group {key[0]} "
                                f"{duration(min(gaps))} apart or more (dumps of different runs)")
                return


def refuse_mixed(problems: list[str], force: bool, notes: list[str]) -> None:
    """``MixedJobsError`` naming the first ``problems`` (mixed-job evidence); with ``force``, notes instead."""
    if problems:
        if not force:
            raise MixedJobsError(
                "these files look like more than one job: " + "; ".join(problems[:3])
                + ". Point comm2perfetto at one job's folder, or pass --force to read them together anyway"
            )
        notes.extend(f"--force: {p}" for p in problems)


def dumps_world(logs: Mapping[int, RankLog], fr: Mapping[int, FrRankTrace]) -> int | None:
    """The world size the event logs or Flight Recorder's default group state, if any."""
    for log in logs.values():
        return log.world_size
    for trace in fr.values():
        cfg = trace.pg_config.get("0")
        if cfg is not None and cfg.ranks:
            return len(cfg.ranks)
    return None


def dumps_times(fr: Mapping[int, FrRankTrace], logs: Mapping[int, RankLog]) -> list[int]:
    """A few times from the dumps and logs (each rank's first and last), to compare traces' times with."""
    times: list[int] = []
    for trace in fr.values():
        for gt in trace.groups.values():
            known = [t for t in (gt.created_col[:1] + gt.created_col[-1:]) if t > 0]
            times.extend(known)
    for log in logs.values():
        times.extend(c.t_call_ns for c in log.calls[:1] + log.calls[-1:])
    return times


def check_fr_groups(fr: Mapping[int, FrRankTrace], logs: Mapping[int, RankLog], problems: list[str]) -> None:
    """Dumps of one job agree on each group's members; the default group's size is the world size."""
    seen: dict[str, tuple[Ranks, int]] = {}
    for rank, trace in fr.items():
        for name, cfg in trace.pg_config.items():
            if cfg.ranks is None:
                continue
            if name in seen and seen[name][0] != cfg.ranks and name == "0":
                problems.append(
                    f"rank {seen[name][1]} and rank {rank} disagree on the default group "
                    f"({len(seen[name][0])} vs {len(cfg.ranks)} ranks)"
                )
            seen.setdefault(name, (cfg.ranks, rank))
    worlds = {log.world_size for log in logs.values()}
    if "0" in seen and len(worlds) == 1:
        (world,) = worlds
        if len(seen["0"][0]) != world:
            problems.append(
                f"the event logs say world size {world} but the Flight Recorder dumps' default group has "
                f"{len(seen['0'][0])} ranks"
            )
