"""Headless Chromium driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``): no
websocket, no driver, no package beyond the standard library.

Chromium reads commands from its fd 3 and writes replies and events to its fd 4, each a JSON object ended by
a NUL byte. ``Browser`` opens one page and records what its console and runtime report::

    with Browser(find_chromium()) as b:
        b.open("file:///tmp/report.html")
        b.evaluate("document.querySelectorAll('svg').length")  # -> 2
        b.screenshot(Path("page.png"))
        b.errors  # console errors, uncaught exceptions, failed loads
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-pipe"]


def find_chromium() -> str | None:
    """Debian's ``chromium`` on PATH (.ci/run installs it), or None: a test does not install software."""
    return shutil.which("chromium")


class Browser:
    def __init__(self, chromium: str, timeout_s: float = 60.0, width: int = 1280, height: int = 900) -> None:
        self._timeout_s = timeout_s
        self._size = (width, height)
        self._profile = tempfile.mkdtemp(prefix="c2p-chromium-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium expects the pipe ends as its fds 3 and 4: dup them there in the child.
        self._proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}",
             "about:blank"],
            pass_fds=(3, 4), preexec_fn=lambda: (os.dup2(to_chrome_r, 3), os.dup2(from_chrome_w, 4)),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buffer = b""
        self._next_id = 0
        self._events: list[dict] = []
        self.errors: list[str] = []
        self._session: str | None = None

    def __enter__(self) -> Browser:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        width, height = self._size
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._session = None
            self.send("Browser.close")
        except Exception:  # already gone: the process is killed below anyway
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self._profile, ignore_errors=True)

    # --- protocol ---------------------------------------------------------------------------------------------

    def send(self, method: str, params: dict | None = None) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session is not None:
            message["sessionId"] = self._session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self) -> dict:
        deadline = time.monotonic() + self._timeout_s
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.poll() is not None else ""
                raise RuntimeError(f"chromium did not answer within {self._timeout_s:.0f} s {err[-2000:]}")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message = json.loads(raw)
        if "method" in message:
            self._note(message)
        return message

    def _note(self, event: dict) -> None:
        self._events.append(event)
        method, params = event["method"], event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                      for a in params.get("args", [])))
        elif method == "Runtime.exceptionThrown":
            self.errors.append("exception: " + str(params.get("exceptionDetails", {}).get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            self.errors.append("log: " + str(params["entry"].get("text")))

    # --- what a test does -------------------------------------------------------------------------------------

    def open(self, url: str) -> None:
        seen = len(self._events)
        self.send("Page.navigate", {"url": url})
        while not any(e["method"] == "Page.loadEventFired" for e in self._events[seen:]):
            self._read()

    def evaluate(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, not only the window."""
        data = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path.write_bytes(base64.b64decode(data))
