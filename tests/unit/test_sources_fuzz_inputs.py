"""Property-based tests: mutations of a real recording never crash, hang or exhaust diagnose, merge or report.

Each example copies ``tests/data/recording/subgroups`` (4 gloo ranks, groups ``pair_a`` = ranks 0, 1 and
``pair_b`` = ranks 2, 3, a resolved stall on ``pair_a``), damages one rank's files (a field set to a wrong type
or an absurd value, a truncation, random bytes, a duplicate, a rename, gzip), and runs the three commands,
each in a forked child under an address-space limit and a time limit (``hostile.run_bounded``). Every run must
end with status 0, 1 or 2 (never 3, an internal error), print no traceback, and finish in time; and a
mutation of one rank's files must not change diagnose's findings about a group that rank is not in.

``COMM2PERFETTO_FUZZ_EXAMPLES`` sets the number of examples (default 100: 300 runs, well under a minute);
``COMM2PERFETTO_FUZZ_STATS=FILE`` writes what was tried (kinds, statuses, peak memory) as JSON, which is
how docs/reliability.md's figures are made (``benchmarks/bench_fuzz.py``). Peak memory is the
largest resident set of a run's process (a fork shares this process's pages, so it is an upper bound).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.hostile import RECORDING, event_lines, load_dump, run_bounded, save_dump, warm_up

EXAMPLES = int(os.environ.get("COMM2PERFETTO_FUZZ_EXAMPLES", "100"))
GROUP_RANKS = {"pair_a": {0, 1}, "pair_b": {2, 3}}
STATS: dict[str, Any] = {"examples": 0, "kinds": Counter(), "status": Counter(), "peak_rss_bytes": 0,
                         "slowest_s": 0.0, "tracebacks": 0, "hangs": 0}

HOSTILE = st.sampled_from([
    None, True, 1.5, -5, -1, 0, 10**100, 2**63, math.nan, math.inf, -math.inf, "zero", "", "x" * 5000, [5],
    [[-1]], [[1.5]], {"a": 1}, [None], list(range(50)),
])


def _files(folder: Path, rank: int, kind: str) -> list[Path]:
    pattern = {"fr": f"rank{rank}.fr.*.pkl", "log": f"rank{rank}.events.jsonl", "stacks": f"rank{rank}.stacks.*.json",
               "kineto": f"rank{rank}.kineto.*.json.gz"}[kind]
    return sorted(folder.glob(pattern))


def _set_fr_field(folder: Path, rank: int, d: st.DataObject) -> str:
    path = d.draw(st.sampled_from(_files(folder, rank, "fr")))
    doc = load_dump(path)
    if not doc["entries"]:
        return "fr_field(empty)"
    entries = doc["entries"]
    every = d.draw(st.booleans())
    key = d.draw(st.sampled_from(sorted(entries[0])))
    value = d.draw(HOSTILE)
    for e in entries if every else [d.draw(st.sampled_from(entries))]:
        e[key] = value
    save_dump(path, doc)
    return f"fr_field:{key}"


def _set_fr_top(folder: Path, rank: int, d: st.DataObject) -> str:
    path = d.draw(st.sampled_from(_files(folder, rank, "fr")))
    doc = load_dump(path)
    key = d.draw(st.sampled_from(["pg_config", "pg_status", "version", "entries", "comm_lib_version"]))
    choice = d.draw(st.integers(0, 2))
    if key == "pg_config" and choice == 0:
        doc[key] = {"0": {"name": "0", "desc": "default_pg", "ranks": d.draw(st.sampled_from(
            ["[0, 1, 2, 3, 99]", "[0, 0]", "[-1, 0]", "(1, 2", "[" + "1," * 200000 + "1]", "[1.5]"]))}}
    elif key == "pg_status" and choice == 0:
        doc[key] = {"0": {"last_completed_collective": d.draw(HOSTILE)}}
    elif key == "entries" and choice == 0:
        doc[key] = doc[key] + [d.draw(HOSTILE)]
    else:
        doc[key] = d.draw(HOSTILE)
    save_dump(path, doc)
    return f"fr_top:{key}"


def _set_header(folder: Path, rank: int, d: st.DataObject) -> str:
    (path,) = _files(folder, rank, "log")
    lines = event_lines(path)
    header = orjson.loads(lines[0])
    key = d.draw(st.sampled_from(["rank", "world_size", "version", "format", "run_id"]))
    header[key] = d.draw(HOSTILE)
    lines[0] = json.dumps(header).encode()  # json, not orjson: it writes NaN and big ints as a writer might
    path.write_bytes(b"\n".join(lines))
    return f"log_header:{key}"


def _set_record(folder: Path, rank: int, d: st.DataObject) -> str:
    (path,) = _files(folder, rank, "log")
    lines = event_lines(path)
    i = d.draw(st.integers(1, len(lines) - 1))
    try:
        record = orjson.loads(lines[i])
    except orjson.JSONDecodeError:
        return "log_record(blank)"
    if not record:
        return "log_record(empty)"
    j = d.draw(st.integers(0, len(record) - 1))
    record[j] = d.draw(HOSTILE)
    lines[i] = json.dumps(record).encode()
    path.write_bytes(b"\n".join(lines))
    return f"log_record:{record[0] if j else 'kind'}"


def _set_stacks(folder: Path, rank: int, d: st.DataObject) -> str:
    files = _files(folder, rank, "stacks")
    if not files:
        return "stacks(none)"
    path = d.draw(st.sampled_from(files))
    doc = orjson.loads(path.read_bytes())
    key = d.draw(st.sampled_from(["rank", "t_ns", "threads", "pending", "trigger_rank"]))
    if key == "threads" and d.draw(st.booleans()):
        doc["threads"][0]["frames"] = [{"file": d.draw(HOSTILE), "line": d.draw(HOSTILE), "func": 5}]
    else:
        doc[key] = d.draw(HOSTILE)
    path.write_text(json.dumps(doc))
    return f"stacks:{key}"


def _set_kineto(folder: Path, rank: int, d: st.DataObject) -> str:
    (path,) = _files(folder, rank, "kineto")
    doc = orjson.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in doc["traceEvents"] if isinstance(e, dict)]
    key = d.draw(st.sampled_from(["ts", "dur", "name", "pid", "tid", "args", "ph", "cat"]))
    for e in events if d.draw(st.booleans()) else [d.draw(st.sampled_from(events))]:
        e[key] = d.draw(HOSTILE)
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return f"kineto:{key}"


def _any_file(folder: Path, rank: int, d: st.DataObject) -> tuple[str, Path | None]:
    """A file of ``rank`` of a drawn kind (dump, log, stacks or trace), or None when it has none of that kind."""
    kind = d.draw(st.sampled_from(["fr", "log", "stacks", "kineto"]))
    files = _files(folder, rank, kind)
    return kind, d.draw(st.sampled_from(files)) if files else None


def _truncate(folder: Path, rank: int, d: st.DataObject) -> str:
    kind, path = _any_file(folder, rank, d)
    if path is None:
        return "truncate(none)"
    data = path.read_bytes()
    path.write_bytes(data[:d.draw(st.integers(0, max(0, len(data) - 1)))])
    return f"truncate:{kind}"


def _scribble(folder: Path, rank: int, d: st.DataObject) -> str:
    kind, path = _any_file(folder, rank, d)
    if path is None:
        return "scribble(none)"
    data = bytearray(path.read_bytes())
    at = d.draw(st.integers(0, len(data)))
    junk = d.draw(st.binary(min_size=1, max_size=64))
    data[at:at + len(junk)] = junk
    path.write_bytes(bytes(data))
    return f"scribble:{kind}"


def _duplicate(folder: Path, rank: int, d: st.DataObject) -> str:
    kind = d.draw(st.sampled_from(["fr", "log"]))
    if kind == "fr":
        src = d.draw(st.sampled_from(_files(folder, rank, "fr")))
        shutil.copy(src, folder / f"rank{rank}.fr.77.pkl")
    else:
        (path,) = _files(folder, rank, "log")
        lines = event_lines(path)
        i = d.draw(st.integers(1, len(lines) - 1))
        path.write_bytes(b"\n".join(lines[:i + 1] + lines[i:]))
    return f"duplicate:{kind}"


def _rename(folder: Path, rank: int, d: st.DataObject) -> str:
    kind = d.draw(st.sampled_from(["fr", "stacks", "kineto"]))
    files = _files(folder, rank, kind)
    if not files:
        return "rename(none)"
    path = d.draw(st.sampled_from(files))
    new = d.draw(st.sampled_from(["rank99", "rank99999999999", "no_rank_here", "rank-7"]))
    path.rename(folder / path.name.replace(f"rank{rank}", new, 1))
    return f"rename:{kind}"


def _gzip(folder: Path, rank: int, d: st.DataObject) -> str:
    path = d.draw(st.sampled_from(_files(folder, rank, "fr") + _files(folder, rank, "log")))
    path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return "gzip"


MUTATIONS = [_set_fr_field, _set_fr_top, _set_header, _set_record, _set_stacks, _set_kineto, _truncate,
             _scribble, _duplicate, _rename, _gzip]


def _findings(run_out: str) -> dict[str, set[tuple]]:
    """Per group of interest: (kind, seq, op, culprits, missing, resolved) of each finding."""
    doc = orjson.loads(run_out)
    out: dict[str, set[tuple]] = {name: set() for name in GROUP_RANKS}
    for f in doc["findings"]:
        out.setdefault(f["process_group"], set()).add(
            (f["kind"], f["seq"], f["op"], tuple(f["culprit_ranks"]), tuple(f["ranks_missing"]), f["resolved"]))
    return out


def _unresolved(findings: set[tuple]) -> set[tuple]:
    return {f for f in findings if not f[-1]}


def _check_isolation(rank: int, found: dict[str, set[tuple]], baseline: dict[str, set[tuple]], kind: str) -> None:
    """Findings about a group the mutated rank is not in are the recording's own. Resolved stalls are job-wide
    history that diagnose shows only while nothing is stuck, and one explains the rest: they are compared
    only when the mutation left no finding on the rank's own groups and nothing unresolved anywhere."""
    own = set().union(*(f for g, f in found.items() if rank in GROUP_RANKS.get(g, {rank})))  # default_pg: all
    quiet = not own and not any(_unresolved(f) for f in found.values())
    for group, members in GROUP_RANKS.items():
        if rank in members:
            continue
        expected = baseline[group] if quiet else _unresolved(baseline[group])
        got = found[group] if quiet else _unresolved(found[group])
        assert got == expected, f"{kind} on rank {rank} changed the findings about {group}: {found}"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[tuple]]:
    warm_up(RECORDING, tmp_path_factory.mktemp("warm") / "job.pftrace")
    run = run_bounded(["diagnose", str(RECORDING), "--format", "json"])
    assert run.rc == 0, run.explain()  # its stall resolved: reported, no problem left
    found = _findings(run.out)
    assert found["pair_a"] and not found["pair_b"], found  # what the recording is for (see its README)
    yield found
    path = os.environ.get("COMM2PERFETTO_FUZZ_STATS")
    if path:
        Path(path).write_text(json.dumps(STATS, indent=2, default=dict))


@settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 100,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rank=st.integers(0, 3), mutation=st.sampled_from(MUTATIONS), data=st.data())
def test_a_mutated_recording_gives_a_verdict_or_one_clear_error(baseline, rank, mutation, data, monkeypatch):
    monkeypatch.setenv("COMM2PERFETTO_TRACEBACK", "1")  # a crash shows where
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "rec"
        shutil.copytree(RECORDING, folder)
        kind = mutation(folder, rank, data)
        STATS["examples"] += 1
        STATS["kinds"][kind] += 1
        runs = [run_bounded(["diagnose", str(folder), "--format", "json"]),
                run_bounded(["merge", str(folder), "-o", str(Path(tmp) / "job.pftrace")]),
                run_bounded(["report", str(folder), "--format", "json"])]
        for run in runs:
            STATS["status"][str(run.rc)] += 1
            STATS["tracebacks"] += run.traceback
            STATS["hangs"] += run.rc is None
            STATS["peak_rss_bytes"] = max(STATS["peak_rss_bytes"], run.peak_rss_bytes)
            STATS["slowest_s"] = max(STATS["slowest_s"], run.secs)
            assert run.rc in (0, 1, 2) and not run.traceback, f"{kind} on rank {rank}: {run.explain()}"
            if run.rc == 2:
                assert run.err.count("\n") == 1 and run.out == "", f"{kind} on rank {rank}: {run.explain()}"
        assert not list(Path(tmp).glob(".*.partial"))
        diagnose = runs[0]
        if diagnose.rc in (0, 1):
            _check_isolation(rank, _findings(diagnose.out), baseline, kind)
