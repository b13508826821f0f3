"""``comm2perfetto open``: the trace is served once, to the Perfetto UI's origin, on the loopback interface."""

from __future__ import annotations

import argparse
import gzip
import threading
import urllib.error
import urllib.request

import pytest

from comm2perfetto.cli import UserError
from comm2perfetto.cli.open import UI, deep_link, make_server, run, serve_until_fetched
from comm2perfetto.trace.formats import sniff_trace
from support.cli import run_cli


def test_the_trace_is_served_once_with_the_ui_origin(tmp_path):
    trace = tmp_path / "job 1.pftrace"
    trace.write_bytes(b"\x0a\x02hi" * 1000)
    server = make_server(trace, 0)
    port = server.server_address[1]
    thread = threading.Thread(target=serve_until_fetched, args=(server,))
    thread.start()
    try:
        with pytest.raises(urllib.error.HTTPError) as err:  # nothing else is served
            urllib.request.urlopen(f"http://127.0.0.1:{port}/etc/passwd", timeout=30)
        assert err.value.code == 404
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/job%201.pftrace", timeout=30) as response:
            assert response.read() == trace.read_bytes()
            assert response.headers["Access-Control-Allow-Origin"] == UI
    finally:
        thread.join(timeout=30)
        server.server_close()
    assert not thread.is_alive() and server.server_address[0] == "127.0.0.1"


def test_deep_link_names_the_file_on_the_uis_port():
    assert deep_link("job.pftrace") == "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/job.pftrace"


def test_a_missing_trace_and_a_busy_port_are_one_line_errors(tmp_path):
    ran = run_cli("open", str(tmp_path / "nope.pftrace"), "--no-browser")
    assert ran.code == 2
    assert "no such trace file" in ran.err
    trace = tmp_path / "job.pftrace"
    trace.write_bytes(b"\x0a\x02hi")
    busy = make_server(trace, 0)
    try:
        with pytest.raises(UserError, match="another program"):
            run(argparse.Namespace(trace=str(trace), port=busy.server_address[1], no_browser=True))
    finally:
        busy.server_close()


@pytest.mark.parametrize("content", [b"meeting notes: merge the traces", b"", b"\x1f\x8b\x08\x00garbage"])
def test_a_file_that_is_no_trace_is_refused_before_serving(tmp_path, content):
    notes = tmp_path / "notes.txt"
    notes.write_bytes(content)
    ran = run_cli("open", str(notes), "--no-browser", "--port", "0")
    assert ran.code == 2
    err = ran.err
    assert err.startswith(f"comm2perfetto open: error: {notes}: not a trace") and err.count("\n") == 1, err


@pytest.mark.parametrize(("head", "kind"), [
    (b"\x0a\x8f\x01\x12", "perfetto"), (b'\n {"traceEvents": []}', "json"), (b"[{", "json"),
    (gzip.compress(b'{"traceEvents": []}', mtime=0), "json"), (b"# tracer: nop\n", "systrace"), (b"hello", None)])
def test_sniff_trace(head, kind):
    assert sniff_trace(head) == kind
