"""``comm2perfetto open job.pftrace``: show a trace in the Perfetto UI in one command.

The UI (https://ui.perfetto.dev) runs in the browser and can load a trace from a URL given in its deep link,
``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/job.pftrace``. So this serves the file on localhost,
prints that link and opens it where a browser is at hand, and stops once the UI has fetched the file. The
trace goes from this machine to the browser only: nothing is uploaded.

Why these choices (as Perfetto's own ``tools/open_trace_in_ui`` does): the UI's content security policy lets it
fetch only from ``127.0.0.1:9001`` (trace_processor's port), so the port is 9001; the response carries
``Access-Control-Allow-Origin: https://ui.perfetto.dev`` so the page may read it; nothing but the one file is
served, and only to the loopback interface. On a cluster node, forward the port first, from your laptop:
``ssh -L 9001:127.0.0.1:9001 NODE``, then open the printed link in the laptop's browser.
"""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import webbrowser
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

from comm2perfetto.cli import UserError, exit_status
from comm2perfetto.trace.formats import sniff_trace

__all__ = ["UI", "add_parser", "deep_link", "make_server", "run", "serve_until_fetched"]

UI = "https://ui.perfetto.dev"
PORT = 9001  # the only port the UI's content security policy lets it fetch a trace from


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "open", help="open a trace in the Perfetto UI (served from this machine, nothing uploaded)",
        description="Serve TRACE on 127.0.0.1, print the ui.perfetto.dev link that loads it (and open it in a "
                    "browser where there is one), and stop once the UI has fetched it. On a cluster node, first "
                    f"run on your laptop: ssh -L {PORT}:127.0.0.1:{PORT} NODE, then open the printed link there.",
        epilog="example:\n  comm2perfetto open run1.pftrace\n\n"
               + exit_status("0    the UI fetched the trace", "130  stopped with Ctrl-C before it did"),
    )
    p.add_argument("trace", metavar="TRACE", help="a .pftrace, .json or .json.gz trace (e.g. merge's output)")
    p.add_argument("--port", type=int, default=PORT,
                   help=f"port to serve on (default {PORT}; the UI fetches only from {PORT}, so another port needs "
                        f"a forward to local port {PORT})")
    p.add_argument("--no-browser", action="store_true", help="only print the link")
    p.set_defaults(func=run)


def deep_link(name: str, port: int = PORT) -> str:
    """The UI's link that loads ``name`` from this server.

    >>> deep_link("job 1.pftrace")
    'https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/job%201.pftrace'
    """
    return f"{UI}/#!/?url=http://127.0.0.1:{port}/{quote(name)}"


def run(args: argparse.Namespace) -> int:
    path = Path(args.trace)
    if not path.is_file():
        raise UserError(f"{path}: no such trace file; give the file `comm2perfetto merge` wrote")
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if sniff_trace(head) is None:
        raise UserError(f"{path}: not a trace (neither Perfetto protobuf nor Chrome JSON; it begins "
                        f"{head[:12]!r}); give the file `comm2perfetto merge` wrote")
    server = make_server(path, args.port)
    link = deep_link(path.name, PORT)
    print(f"serving {path} on http://127.0.0.1:{args.port}/ until the Perfetto UI has loaded it (Ctrl-C to stop)")
    print(f"open: {link}")
    print(f"on a remote machine, run on your laptop first: ssh -L {PORT}:127.0.0.1:{args.port} <this host>")
    sys.stdout.flush()
    if not args.no_browser and _has_display():
        try:
            webbrowser.open_new_tab(link)
        except webbrowser.Error:
            pass  # no browser here: the printed link is the way
    try:
        serve_until_fetched(server)
    except KeyboardInterrupt:
        print("stopped before the UI fetched the trace", file=sys.stderr)
        return 130
    finally:
        server.server_close()
    print("the Perfetto UI has the trace; stopped serving")
    return 0


def _has_display() -> bool:
    """Whether a graphical browser can open here: on a headless Linux node ``webbrowser`` would start a text
    browser (lynx, w3m) in the terminal instead."""
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class _Server(http.server.HTTPServer):
    trace: Path
    fetched: bool = False


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        trace = self.server.trace
        if self.path.split("?")[0] != "/" + quote(trace.name):
            self.send_error(404, "only the trace is served here")
            return
        try:
            data = trace.read_bytes()
        except OSError as exc:
            self.send_error(500, f"cannot read the trace: {exc.strerror}")
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Access-Control-Allow-Origin", UI)
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        self.wfile.write(data)
        self.server.fetched = True

    def log_message(self, format: str, *args) -> None:
        pass  # the requests are not the user's business


def make_server(path: Path, port: int) -> _Server:
    """A server of ``path`` on 127.0.0.1:``port`` (0: any free port); UserError when the port is taken."""
    try:
        server = _Server(("127.0.0.1", port), _Handler)
    except OSError as exc:
        raise UserError(f"cannot serve on 127.0.0.1:{port} ({exc.strerror}): another program (a trace_processor "
                        f"--httpd?) holds it; stop it, or use --port with an SSH forward to local port {PORT}") \
            from None
    server.trace = path
    return server


def serve_until_fetched(server: _Server, poll: Callable[[], bool] | None = None) -> None:
    """Answer requests until the trace was sent once (``poll`` returning True stops early)."""
    while not server.fetched and not (poll is not None and poll()):
        server.handle_request()
