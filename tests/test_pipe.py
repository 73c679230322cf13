"""A pipe is read in few, large reads (dump/pipe.py): llama-eval-callback writes each printed number on its own, and a
reader woken by each write spent more CPU than the check, on the cores llama.cpp computes on."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

from attncheck.dump import pipe
from conftest import FIXTURES

DUMP = FIXTURES / "gpt2-how-are-you.txt"


def _write_as_llama(fd: int, data: bytes, size: int = 13, every: int = 64) -> int:
    """Write `data` into the pipe `fd` as llama-eval-callback does, a number's print per write; a short sleep every
    `every` writes keeps the pipe from filling, as a model computing between prints does. Returns the writes."""
    writes = 0
    for at in range(0, len(data), size):
        os.write(fd, data[at:at + size])
        writes += 1
        if writes % every == 0:
            time.sleep(0.0005)
    os.close(fd)
    return writes


class _Counted:
    """The pipe's buffered reader, counting the reads the paced reader asks of it."""

    def __init__(self, inner):
        self.inner, self.reads = inner, 0

    def readinto1(self, b):
        self.reads += 1
        return self.inner.readinto1(b)

    def fileno(self):
        return self.inner.fileno()


def test_a_pipe_written_a_number_at_a_time_is_read_whole_in_few_reads():
    data = DUMP.read_bytes()
    r, w = os.pipe()
    counted = _Counted(os.fdopen(r, "rb"))
    writes: list[int] = []
    writer = threading.Thread(target=lambda: writes.append(_write_as_llama(w, data)))
    writer.start()
    stream = pipe.paced(counted)
    got = b"".join(iter(lambda: stream.read(1 << 16), b""))
    writer.join()
    assert got == data
    # an eager reader makes about one read per write; the paced one waits for the pipe to fill
    assert writes[0] > 5000 and counted.reads < writes[0] / 20, (writes, counted.reads)


def test_a_read_returns_what_it_asks_for_fewer_only_at_the_end():
    r, w = os.pipe()
    stream = pipe.paced(os.fdopen(r, "rb"))
    writer = threading.Thread(target=_write_as_llama, args=(w, b"x" * 100_000, 1000, 1))
    writer.start()
    sizes = [len(stream.read(30_000)) for _ in range(5)]
    writer.join()
    assert sizes == [30_000, 30_000, 30_000, 10_000, 0]


def test_only_a_pipe_is_paced():
    with open(DUMP, "rb") as f:
        assert pipe.paced(f) is f  # a file: mapped and cut as it is (parts.regular_size needs its name and tell)
    r, w = os.pipe()
    with os.fdopen(r, "rb") as f:
        assert isinstance(pipe.paced(f).raw, pipe._Paced)
    os.close(w)


def test_a_dump_piped_slowly_gets_the_files_report():
    data = DUMP.read_bytes()
    argv = [sys.executable, "-m", "attncheck", "check", "--json", "-"]
    reader = subprocess.Popen([*argv, "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _write_as_llama(reader.stdin.fileno(), data, size=4096, every=4)
    reader.stdin = None  # _write_as_llama closed its descriptor
    out, err = reader.communicate(timeout=120)
    whole = subprocess.run([*argv, str(DUMP)], capture_output=True, timeout=120)
    assert reader.returncode == whole.returncode == 0, err
    piped, filed = json.loads(out), json.loads(whole.stdout)
    assert (piped.pop("source"), filed.pop("source")) == ("<stdin>", str(DUMP))
    assert piped == filed and filed["totals"]["sites"] > 0


def test_attncheck_run_reads_llamas_pipe_in_few_reads_too(monkeypatch):
    """`attncheck run` reads llama-eval-callback's output through Tee (cli/llama.py), paced the same way."""
    from attncheck.cli import llama

    reads = []
    real = os.read
    monkeypatch.setattr(llama.os, "read", lambda fd, n: reads.append(n) or real(fd, n))
    writer = ("import os, sys, time\n"
              "data = open(sys.argv[1], 'rb').read()\n"
              "for k, at in enumerate(range(0, len(data), 13)):\n"
              "    os.write(1, data[at:at + 13])\n"
              "    k % 64 or time.sleep(0.0005)\n")
    with llama.Process([sys.executable, "-c", writer, str(DUMP)], None) as proc:
        got = b"".join(iter(lambda: proc.stream.read(1 << 16), b""))
        assert proc.finish() == 0
    monkeypatch.undo()
    assert got == DUMP.read_bytes()
    assert 0 < len(reads) < len(got) / 13 / 20, len(reads)
