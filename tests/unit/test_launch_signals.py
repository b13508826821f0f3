"""``record``'s launcher: a signal forwarded to the job's process group is followed by SIGTERM and SIGKILL also
while the launcher itself lives on (a shell in ``wait`` whose background children ignore SIGINT)."""

from __future__ import annotations

import json
import subprocess
import sys
import time

# Run in a child interpreter: signal handlers belong to the main thread. The launcher ignores SIGINT and waits
# for its own child, which inherits the ignored SIGINT (as a shell's background jobs do): only SIGTERM ends it.
SCRIPT = r"""
import json, os, signal, sys, threading, time
from comm2perfetto import launch
launch.GRACE_S = 0.5
stubborn = ("import signal, subprocess, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
            "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])")
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
ending = launch.run_forwarding_signals([sys.executable, "-c", stubborn], dict(os.environ))
print(json.dumps({"s": time.monotonic() - t0, "signal": ending.signal, "status": ending.status,
                  "killed": ending.killed_leftovers}))
"""


def test_a_launcher_that_outlives_the_forwarded_sigint_is_terminated_after_the_grace():
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    ending = json.loads(out.stdout)
    # SIGINT at 1 s, SIGTERM 0.5 s later: well before the job's 60 s sleep would have ended it
    assert ending["signal"] == "SIGINT" and ending["killed"] is True
    assert ending["status"] == 128 + 15  # the launcher died of the SIGTERM
    assert ending["s"] < 20, ending
    assert time.monotonic() - t0 < 40
