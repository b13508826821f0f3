"""The crash-safe event log (record/log.py) and its reader (sources/event_log.py)."""

from __future__ import annotations

import threading

import orjson
import pytest

from comm2perfetto.record.log import EventLog
from comm2perfetto.sources.event_log import EventLogError, read_event_log

HEADER = {"kind": "header", "format": "comm2perfetto-events", "version": 1, "rank": 3, "world_size": 4}
RECORDS = [
    ["g", 0, "0", "default_pg", [0, 1, 2, 3], "gloo"],
    ["s", 1, "train.py:57 main"],
    ["a", 1, [[4]], ["Float"], 16],
    ["b", 1, 1000, "all_reduce", 0, 1, None, False, 77, 1, 0, 0, 1],
    ["e", 1, 1500, 1],
]


def _lines(records) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _write_log(path, records, chunk=4096) -> EventLog:
    log = EventLog(str(path), chunk=chunk)
    for record in records:
        log.write(record)
    return log


def test_records_are_lines_and_close_truncates_the_padding(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    log = _write_log(path, [HEADER, *RECORDS, ["z", 2000, 5, "exit"]])
    expected = _lines([HEADER, *RECORDS, ["z", 2000, 5, "exit"]])
    assert log.bytes_written == len(expected)
    # While open: the file is one chunk long, the records followed by zeros.
    raw = path.read_bytes()
    assert len(raw) == 4096
    assert raw == expected + b"\0" * (4096 - len(expected))
    log.close()
    assert path.read_bytes() == expected
    assert log.bytes_written == len(expected)
    log.close()  # twice is fine
    log.write(["w", 1, "after close"])  # ignored, no error
    assert path.read_bytes() == expected


def test_log_grows_past_its_first_chunk(tmp_path):
    path = tmp_path / "big.jsonl"
    records = [["s", i, "x" * (i % 50)] for i in range(2000)]
    log = _write_log(path, records, chunk=4096)
    assert len(path.read_bytes()) % 4096 == 0 and len(path.read_bytes()) > 4096
    log.close()
    assert path.read_bytes() == _lines(records)


def test_concurrent_writers_never_interleave(tmp_path):
    path = tmp_path / "threads.jsonl"
    log = EventLog(str(path), chunk=1 << 16)
    per_thread = 3000

    def writer(t: int) -> None:
        for i in range(per_thread):
            log.write(["m", i, f"thread-{t}", t, "test"])

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    records = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert len(records) == 4 * per_thread
    for t in range(4):  # each thread's records all there, in its own order
        assert [r[1] for r in records if r[3] == t] == list(range(per_thread))


def test_records_are_on_disk_without_close_or_flush(tmp_path):
    """What a SIGKILLed rank leaves: the mapping was never flushed, closed or truncated."""
    path = tmp_path / "rank3.events.jsonl"
    log = _write_log(path, [HEADER, *RECORDS])
    # Another process (here: the reader) sees every record already.
    parsed = read_event_log(path)
    assert parsed.problems == [NOT_CLOSED]
    assert not parsed.closed_cleanly
    (call,) = parsed.calls
    assert (call.op, call.site, call.shapes, call.dtypes, call.nbytes, call.t_return_ns) == \
        ("all_reduce", "train.py:57 main", [[4]], ["Float"], 16, 1500)
    log.abandon()  # a forked child lets go of the mapping without touching the file
    log.write(["w", 1, "ignored"])
    assert path.read_bytes().rstrip(b"\0") == _lines([HEADER, *RECORDS])
    assert len(path.read_bytes()) == 4096


# --- the reader ---------------------------------------------------------------------------------------------

NOT_CLOSED = "rank3.events.jsonl: not closed cleanly (the rank died, or still runs): read up to its last record"

def test_reader_skips_a_torn_last_line_and_reports_it(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    torn = orjson.dumps(["e", 2, 1800, 2])[:7]
    path.write_bytes(_lines([HEADER, *RECORDS]) + torn + b"\0" * 300)
    log = read_event_log(path)
    assert [c.op for c in log.calls] == ["all_reduce"]
    assert log.calls[0].t_return_ns == 1500
    assert log.problems == ["rank3.events.jsonl: torn last record skipped (JSONDecodeError)", NOT_CLOSED]
    assert not log.closed_cleanly


def test_reader_strips_nul_padding(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    path.write_bytes(_lines([HEADER, *RECORDS]) + b"\0" * 4000)
    log = read_event_log(path)
    assert log.problems == [NOT_CLOSED]
    assert (log.rank, log.world_size, len(log.calls), log.closed_reason) == (3, 4, 1, None)


def test_reader_reports_a_bad_record_in_the_middle(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    lines = _lines([HEADER, *RECORDS[:3]]) + b'["b", "not enough fields"]\n' + _lines(RECORDS[3:])
    path.write_bytes(lines + _lines([["z", 1, 2, "exit"]]))
    log = read_event_log(path)
    assert log.problems == ["rank3.events.jsonl: 1 bad line skipped (first at line 5: 'b' record with 1 fields)"]
    assert [c.op for c in log.calls] == ["all_reduce"] and log.closed_reason == "exit"


def test_reader_ignores_unknown_kinds_and_extra_fields(tmp_path):
    """Later versions only append fields and add kinds: a version-1 reader reads them."""
    path = tmp_path / "rank3.events.jsonl"
    records = [*RECORDS[:4], ["e", 1, 1500, 1, "a later field"], ["y", "a later kind"], ["z", 1, 2, "exit", 9]]
    path.write_bytes(_lines([HEADER, *records]))
    log = read_event_log(path)
    assert log.problems == []
    assert log.calls[0].seq_last == 1 and log.closed_reason == "exit"


@pytest.mark.parametrize("content, message", [
    (b"", "empty file, not a comm2perfetto event log"),
    (b"\0" * 100, "empty file, not a comm2perfetto event log"),
    (b"\x80\x02}q\x00.", "first line is not JSON, not a comm2perfetto event log"),  # a pickle
    (b"hello world\n", "first line is not JSON, not a comm2perfetto event log"),
    (b'{"traceEvents": []}\n', "no comm2perfetto event log header"),
    (b'["b", 1]\n', "no comm2perfetto event log header"),
])
def test_reader_rejects_what_is_not_an_event_log(tmp_path, content, message):
    path = tmp_path / "rank0.events.jsonl"
    path.write_bytes(content)
    with pytest.raises(EventLogError) as info:
        read_event_log(path)
    assert str(info.value) == f"{path}: {message}"


def test_reader_rejects_a_newer_version_and_says_what_to_do(tmp_path):
    path = tmp_path / "rank0.events.jsonl"
    path.write_bytes(_lines([{**HEADER, "version": 2}, *RECORDS]))
    with pytest.raises(EventLogError) as info:
        read_event_log(path)
    assert str(path) in str(info.value)
    assert "version 2 is newer than this reader" in str(info.value)
    assert "upgrade comm2perfetto" in str(info.value)


def test_reader_names_a_missing_file(tmp_path):
    path = tmp_path / "missing.jsonl"
    with pytest.raises(EventLogError, match=r"missing\.jsonl: cannot read"):
        read_event_log(path)


# A synchronous call (b, e) on a CPU tensor and one on a CUDA tensor, as the recorder writes them on a group
# whose backend depends on the device: the `a` record carries the device there.
MIXED = [
    ["g", 0, "0", "default_pg", [0, 1, 2, 3], "cpu:gloo,cuda:nccl", {"cpu": "gloo", "cuda": "nccl"}],
    ["a", 1, [[4]], ["Float"], 16, "cpu"],
    ["a", 2, [[4]], ["Float"], 16, "cuda"],
    ["b", 1, 1000, "all_reduce", 0, 1, None, False, 77, 0, 0, 0, 1],
    ["e", 1, 1500, 1],
    ["b", 2, 2000, "all_reduce", 0, 2, None, False, 77, 0, 0, 0, 2],
    ["e", 2, 2500, 2],
    ["a", 3, [], [], None],
    ["b", 3, 3000, "barrier", 0, 3, None, False, 77, 0, 0, 0, 3],
    ["e", 3, 3500, 3],
    ["z", 4000, 5, "exit"],
]


@pytest.mark.parametrize(("g", "cpu_call", "cuda_call", "no_tensor"), [
    # what the recorder writes now: the backend that runs each device's calls
    (["g", 0, "0", "default_pg", [0, 1, 2, 3], "undefined", {"cpu": "gloo"}], True, True, True),
    (["g", 0, "0", "default_pg", [0, 1, 2, 3], "nccl", {"cuda": "nccl"}], True, False, False),
    (MIXED[0], True, False, False),
    # logs written before the map: c10d's backend string decides ("undefined": not known)
    (["g", 0, "0", "default_pg", [0, 1, 2, 3], "cpu:gloo"], True, True, True),
    (["g", 0, "0", "default_pg", [0, 1, 2, 3], "gloo"], True, True, True),
    (["g", 0, "0", "default_pg", [0, 1, 2, 3], "undefined"], True, False, False),
])
def test_completion_on_return_follows_the_call_tensors_and_the_backend_that_ran_it(
        tmp_path, g, cpu_call, cuda_call, no_tensor):
    """A synchronous call on CPU tensors is complete when it returns; otherwise the backend that ran the call
    (by its tensors' device) decides: a CPU backend returns once the work is done, NCCL at enqueue."""
    path = tmp_path / "rank3.events.jsonl"
    path.write_bytes(_lines([HEADER, g, *MIXED[1:]]))
    log = read_event_log(path)
    assert log.problems == []
    group = log.groups[0]
    calls = {c.cid: c for c in log.calls}
    assert (calls[1].device, calls[2].device, calls[3].device) == ("cpu", "cuda", None)
    assert [group.completes_on_return(calls[cid]) for cid in (1, 2, 3)] == [cpu_call, cuda_call, no_tensor]


def test_async_and_functional_calls_do_not_complete_on_return(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    path.write_bytes(_lines([HEADER, MIXED[0], MIXED[1], ["b", 1, 1000, "all_reduce", 0, 1, None, True, 77, 0, 0,
                                                          0, 1], ["e", 1, 1500, 1],
                             ["b", 2, 2000, "all_reduce", 0, 2, None, True, 77, 0, 0, 0, 1, 1], ["e", 2, 2100, 2],
                             ["d", 2, 2400], MIXED[-1]]))
    log = read_event_log(path)
    group = log.groups[0]
    assert [group.completes_on_return(c) for c in log.calls] == [False, False]
    assert [c.t_end_ns for c in log.calls] == [None, 2400]


def test_a_malformed_device_map_is_left_out(tmp_path):
    path = tmp_path / "rank3.events.jsonl"
    path.write_bytes(_lines([HEADER, ["g", 0, "0", "default_pg", [0, 1], "gloo", {"cpu": 5}],
                             ["a", 1, [[4]], ["Float"], 16, 7], MIXED[-1]]))
    log = read_event_log(path)
    assert log.problems == [] and log.groups[0].devices is None
