"""The JSON files of ours (live snapshot, live window, stall stacks) go through one check before their reader's
own: each refuses a FIFO, a corrupt gzip, garbage and another format with one line naming the file."""

from __future__ import annotations

import gzip
import os

import pytest

from comm2perfetto.sources.event_log import EventLogError
from comm2perfetto.sources.live import LiveSnapshotError, read_snapshot
from comm2perfetto.sources.live_window import LiveWindowError, read_window
from comm2perfetto.sources.stacks import read_stacks

READERS = [  # (reader, its error, what it calls a file of another format)
    (read_snapshot, LiveSnapshotError, "not a comm2perfetto live snapshot"),
    (read_window, LiveWindowError, "not a comm2perfetto window"),
    (read_stacks, EventLogError, "not a comm2perfetto stacks file"),
]


@pytest.mark.parametrize(("reader", "error", "other_format"), READERS)
def test_each_reader_refuses_what_is_not_its_document(tmp_path, reader, error, other_format):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # opened, it would block the reader forever
    cases = {
        fifo: "not a regular file (a FIFO); not read",
        tmp_path / "absent.json": "cannot read (No such file or directory)",
        tmp_path / "garbage.json": "unreadable (",
        tmp_path / "cut.json.gz": "unreadable (",
        tmp_path / "other.json": other_format,
        tmp_path / "list.json": other_format,
    }
    (tmp_path / "garbage.json").write_bytes(b"\x00{]")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"format": "x"}' * 100)[:40])
    (tmp_path / "other.json").write_text('{"format": "comm2perfetto-events", "version": 1}')
    (tmp_path / "list.json").write_text("[1, 2]")
    for path, message in cases.items():
        with pytest.raises(error) as caught:
            reader(path)
        text = str(caught.value)
        assert text.startswith(f"{path}: ") and message in text and "\n" not in text, (path, text)
