"""``record``'s launcher: a signal forwarded to the job's process group is followed by SIGTERM and SIGKILL, on one
clock from the signal, while the launcher itself lives on (a shell in ``wait`` whose background children ignore
SIGINT) and after it left ranks behind."""

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

# The launcher dies of the SIGINT at once, leaving a rank that ignores SIGINT and SIGTERM: only the SIGKILL,
# 2 x GRACE_S after the signal, ends it; the rank writes its pid so that the test can see it is gone.
LEFT_BEHIND = r"""
import json, os, signal, sys, threading, time
from comm2perfetto import launch
from comm2perfetto.processes import process_state
launch.GRACE_S = 0.5
rank = ("import os, signal, sys, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); open(sys.argv[1], 'w').write(str(os.getpid())); "
        "time.sleep(60)")
launcher = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', sys.argv[1], sys.argv[2]]); "
            "time.sleep(60)")
pid_file = sys.argv[1]
threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()
t0 = time.monotonic()
ending = launch.run_forwarding_signals([sys.executable, "-c", launcher, rank, pid_file], dict(os.environ))
s = time.monotonic() - t0
# a zombie is gone too (an init that reaps lazily, as in some containers, may leave it a while)
alive = process_state(int(open(pid_file).read())) != "gone"
print(json.dumps({"s": s, "signal": ending.signal, "status": ending.status, "killed": ending.killed_leftovers,
                  "rank_alive": alive}))
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


def test_a_rank_the_launcher_left_behind_is_killed_on_the_signals_clock(tmp_path):
    out = subprocess.run([sys.executable, "-c", LEFT_BEHIND, str(tmp_path / "rank.pid")], capture_output=True,
                         text=True, timeout=50)
    assert out.returncode == 0, out.stderr
    ending = json.loads(out.stdout)
    # the launcher died of the SIGINT (Python ends of an uncaught KeyboardInterrupt by the signal), or of the
    # SIGTERM 0.5 s later when its ending took longer on a busy machine; the rank ignored both
    assert ending["signal"] == "SIGINT" and ending["status"] in (128 + 2, 128 + 15), ending
    assert ending["killed"] is True and ending["rank_alive"] is False, ending
    # SIGINT at 2 s, SIGKILL 1 s later: one clock from the signal, not a fresh grace per stage
    assert 2.9 < ending["s"] < 20, ending
