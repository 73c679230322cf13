"""Running attncheck on hostile input, as an attacker or an unlucky user would: in a subprocess with a time limit
(where hanging is the point) and its peak memory read back from the kernel (where memory is the point).

The limits are not timings of attncheck (those belong in `make bench`): each is many times what the bounded work
takes and far below what the unbounded work took, so a test fails only when the bound is gone.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Measured:
    code: int
    out: str
    err: str
    peak_mb: float  # peak resident memory of the process, or of the largest process of a shell pipeline
    timed_out: bool


def environ(**extra: str) -> dict[str, str]:
    """The environment a user's shell gives: this checkout's attncheck, no COLUMNS."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return {**env, **extra}


def attncheck_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "attncheck", *map(str, args)]


# The command runs under this small Python, which writes its children's peak RSS (the kernel's figure for the
# processes it waited for) to argv[1] and ends as the command did. Read from a child of the test itself, the figure
# would be the test's own peak whenever that is higher: subprocess forks with vfork, and exec records the memory the
# child shared until then, the test's (a 254 MB figure for a 150 MB attncheck once the suite had grown).
_PEAK = ("import os, resource, signal, subprocess, sys\n"
         "code = subprocess.call(sys.argv[2:])\n"
         "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
         "if code < 0:\n"
         "    signal.signal(-code, signal.SIG_DFL)\n"
         "    os.kill(os.getpid(), -code)\n"
         "sys.exit(code)\n")


def measured(args: list[str], *, timeout: float, stdin=subprocess.DEVNULL, env: dict | None = None,
             shell: bool = False) -> Measured:
    """Run a command (a shell pipeline with shell=True) to its end or `timeout` seconds (then its process group is
    killed), and read its peak RSS: the largest of its processes' (_PEAK; wait4's figure when it was killed)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as peak:
        command = ["bash", "-c", args] if shell else list(args)
        proc = subprocess.Popen([sys.executable, "-c", _PEAK, peak.name, *command], stdin=stdin, stdout=out,
                                stderr=err, env=env or environ(), start_new_session=True)
        fired = threading.Event()

        def kill() -> None:
            fired.set()
            os.killpg(proc.pid, signal.SIGKILL)

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        kib = peak.read().strip()
        return Measured(proc.returncode, out.read().decode("utf-8", "replace"), err.read().decode("utf-8", "replace"),
                        (int(kib) if kib else usage.ru_maxrss) / 1024, fired.is_set())
