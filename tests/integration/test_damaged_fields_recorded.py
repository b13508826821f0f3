"""A damaged field is not evidence (issue 32, point 8): every single-field mutation of one Flight Recorder entry,
and of a dump's top-level keys, leaves a healthy verdict as it was, and the damaged field is named.

Two real recordings: ``tests/data/recording/subgroups`` (4 gloo ranks, a resolved stall) and a 2-rank gloo job
recorded here with ``comm2perfetto record``; each read whole and as its Flight Recorder dumps alone (where a
dropped entry would read as "never issued": nothing else says the rank issued it). In each, one entry of rank 0
(the middle of its newest dump) gets each field set to each wrong value, in the newest dump only (its older dumps
hold the same record intact) and in every dump of the rank. Then:

- ``diagnose`` says what it said of the intact recording: exit 0, status ok, the same findings, no culprit or
  suspect (a field read as unknown never makes one);
- a note names the field, unless the value is None (an absent field, as older formats leave fields out);
- ``merge`` and ``report`` exit 0: no "more than one job", no traceback.

A failure lists every mutation that broke the verdict and every one not named, with the counts. The default
cases cover every field and value where the verdict rests on the dumps alone, and ``merge`` and ``report`` on
the whole recording for what they read (about 1,200 runs); ``COMM2PERFETTO_DAMAGE_ALL=1`` runs every recording,
scope and command (about 3,500).
"""

from __future__ import annotations

import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from support.cli import run_cli
from support.hostile import RECORDING, load_dump, save_dump
from support.torch_features import needs_gloo_flight_recorder

pytestmark = [pytest.mark.integration, needs_gloo_flight_recorder()]

# Each field of the entry is set to each of these: wrong types, and numbers no field can hold.
VALUES = {"str": "zero", "None": None, "nan": math.nan, "inf": math.inf, "1e40": 1e40, "-1": -1, "huge": 2**70,
          "list": [5], "dict": {"a": 1}}
TOP_KEYS = ("pg_config", "pg_status", "version")
# What the readers read of a gloo recording's collectives (the rest, e.g. thread_name or timeout_ms, nothing
# reads; frames only merge, which has no notes in its output): a damaged one must be named.
READ = {"profiling_name", "process_group", "collective_seq_id", "is_p2p", "state", "time_discovered_started_ns",
        "time_discovered_completed_ns", "time_created_ns", "input_sizes", "input_dtypes", "output_sizes",
        "output_dtypes", "record_id", "op_id", "pg_id"}
ALL = os.environ.get("COMM2PERFETTO_DAMAGE_ALL") == "1"
DIAGNOSE, EVERY_COMMAND = ("diagnose",), ("diagnose", "merge", "report")
# (recording, scopes, commands, the entry fields mutated: None for all)
CASES = [("gloo2 dumps only", ("newest", "every"), DIAGNOSE, None),
         ("subgroups dumps only", ("every",), DIAGNOSE, None),
         ("subgroups", ("every",), EVERY_COMMAND, READ | {"frames"})]
if ALL:
    CASES = [(name, ("newest", "every"), EVERY_COMMAND, None)
             for name in ("gloo2 dumps only", "gloo2", "subgroups dumps only", "subgroups")]

GLOO_JOB = """
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.ones(4)
    for step in range(4):
        dist.all_reduce(x)
        dist.broadcast(x, src=0)
        out = torch.empty(8)
        dist.all_gather_into_tensor(out, x)
    dist.barrier()
    dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def recordings(module_jobs, tmp_path_factory) -> dict[str, Path]:
    job = module_jobs.run(GLOO_JOB, nproc=2)
    assert job.returncode == 0 and len(job.fr_dumps(0)) >= 2, job.explain()
    out = {"subgroups": RECORDING, "gloo2": job.out}
    for name, folder in list(out.items()):
        dumps = tmp_path_factory.mktemp(f"{name}-dumps")
        for path in folder.glob("*.fr.*.pkl"):
            shutil.copy(path, dumps)
        out[f"{name} dumps only"] = dumps
    return out


def _dumps(folder: Path, rank: int) -> list[Path]:
    """The rank's dumps, oldest first (by the recorder's counter)."""
    return sorted(folder.glob(f"rank{rank}.fr.*.pkl"), key=lambda p: int(p.name.split(".")[2]))


def _middle_record(folder: Path) -> int:
    """The record id of the entry in the middle of rank 0's newest dump."""
    entries = load_dump(_dumps(folder, 0)[-1])["entries"]
    return entries[len(entries) // 2]["record_id"]


def _mutations(folder: Path, scopes: tuple[str, ...], fields: set[str] | None) -> Iterator[tuple[str, str, str, str]]:
    """(scope, where, key, value name) of every mutation: where is ``entry`` or ``top``."""
    (entry,) = [e for e in load_dump(_dumps(folder, 0)[-1])["entries"] if e["record_id"] == _middle_record(folder)]
    for scope in scopes:
        for where, keys in (("entry", [k for k in sorted(entry) if fields is None or k in fields]), ("top", TOP_KEYS)):
            for key in keys:
                for value in VALUES:
                    yield scope, where, key, value


def _mutate(folder: Path, record: int, scope: str, where: str, key: str, value: str) -> None:
    dumps = _dumps(folder, 0)
    for path in dumps[-1:] if scope == "newest" else dumps:
        doc = load_dump(path)
        if where == "top":
            doc[key] = VALUES[value]
        else:
            for e in doc["entries"]:
                if e["record_id"] == record:
                    e[key] = VALUES[value]
        save_dump(path, doc)


def _verdict(doc: dict) -> tuple:
    findings = sorted((f["kind"], f["process_group"], f["seq"], tuple(f["culprit_ranks"]), tuple(f["suspect_ranks"]),
                       f["resolved"]) for f in doc["findings"])
    return doc["status"], tuple(doc["culprit_ranks"]), tuple(doc["suspect_ranks"]), tuple(findings)


@pytest.mark.timeout(1800 if ALL else 900)  # hundreds of runs: a minute each case on an idle 2-core machine
@pytest.mark.parametrize(("name", "scopes", "commands", "fields"), CASES, ids=[c[0] for c in CASES])
def test_a_damaged_field_leaves_the_verdict_and_is_named(recordings, tmp_path, name, scopes, commands, fields):
    source = recordings[name]
    intact = run_cli("diagnose", source, "--format", "json")
    assert intact.code == 0, intact.err
    expected = _verdict(orjson.loads(intact.out))
    assert expected[:3] == ("ok", (), ()), expected  # a healthy recording (subgroups: its stall resolved)
    record = _middle_record(source)
    broken, unnamed, tried = [], [], 0
    for scope, where, key, value in _mutations(source, scopes, fields):
        folder = tmp_path / "damaged"
        shutil.copytree(source, folder)
        _mutate(folder, record, scope, where, key, value)
        tried += 1
        what = f"{key}={value} ({where} of record {record}, {scope} dump{'s' if scope == 'every' else ''})"
        run = run_cli("diagnose", folder, "--format", "json")
        if run.code != 0:
            broken.append(f"{what}: diagnose exit {run.code}: {(run.out or run.err).strip()[-300:]}")
        else:
            doc = orjson.loads(run.out)
            if _verdict(doc) != expected:
                broken.append(f"{what}: {_verdict(doc)}")
            if VALUES[value] is not None and (where == "top" or key in READ) \
                    and not any(key in note for note in doc["notes"]):
                unnamed.append(f"{what}: notes {doc['notes']}")
        for argv in (["merge", str(folder), "-o", str(tmp_path / "job.pftrace")],
                     ["report", str(folder), "--format", "json"]):
            if argv[0] in commands:
                other = run_cli(*argv)
                if other.code != 0:  # an internal error, "more than one job": each a non-zero exit
                    broken.append(f"{what}: {argv[0]} exit {other.code}: {other.err.strip()[-300:]}")
        shutil.rmtree(folder)
    assert not broken and not unnamed, (
        f"{len(broken)} of {tried} mutations broke the verdict, {len(unnamed)} were not named:\n"
        + "\n".join(broken + unnamed))
