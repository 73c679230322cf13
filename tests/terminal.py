"""Running attncheck as a person does: in a pseudo-terminal of a given width, with or without NO_COLOR, the output
kept as the terminal got it (escapes included) and as the lines a person reads (escapes removed)."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def in_terminal(columns: int, *args, no_color: bool = False) -> tuple[int, str]:
    """Exit code and everything written (stdout and stderr, as a terminal shows them) by attncheck in a
    pseudo-terminal of `columns` × 50; NO_COLOR=1 when asked, else no NO_COLOR at all."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "CI", "NO_COLOR")}
    env["TERM"] = "xterm-256color"
    if no_color:
        env["NO_COLOR"] = "1"
    proc = subprocess.Popen([sys.executable, "-m", "attncheck", *map(str, args)], stdin=slave, stdout=slave,
                            stderr=slave, env=env, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    code = proc.wait(timeout=120)
    return code, b"".join(chunks).decode("utf-8", "replace").replace("\r\n", "\n")


def plain(raw: str) -> list[str]:
    """The lines a person reads: escapes removed."""
    return ANSI.sub("", raw).splitlines()
