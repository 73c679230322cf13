"""`attncheck run`: start llama-eval-callback and check its output as it streams, optionally keeping a copy.

`attncheck.run(model, prompt, ...)` is run_llama: `attncheck run` for Python.
"""
from __future__ import annotations

import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections import deque
from functools import lru_cache
from typing import BinaryIO

from ..dump.pipe import Pace, enlarge
from ..errors import DumpError, ModelError

BINARY = "llama-eval-callback"
ENV_BINARY = "LLAMA_EVAL_CALLBACK"


def find_binary(given: str | None) -> str:
    """--bin, then $LLAMA_EVAL_CALLBACK, then llama-eval-callback on PATH."""
    for candidate, origin in ((given, "--bin"), (os.environ.get(ENV_BINARY), f"${ENV_BINARY}")):
        if candidate:
            path = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
            if path is None:
                raise DumpError(origin, None, f"'{candidate}' is not an executable file")
            return path
    path = shutil.which(BINARY)
    if path is None:
        raise DumpError(BINARY, None, f"not found: pass --bin PATH, set ${ENV_BINARY}, or build it with `make llama`")
    return path


_FA_VALUES = re.compile(r"--flash-attn\s*[\[<]?\s*on\s*\|\s*off")
_FA_ANY = re.compile(r"(?:^|\s)(?:-fa|--flash-attn)\b")


@lru_cache(maxsize=8)
def flash_attn_syntax(binary: str) -> str:
    """How this llama-eval-callback takes flash attention, read from its `--help`: "value" (today: `--flash-attn
    on|off|auto`, default auto, i.e. on for the CPU), "switch" (2024 builds: a bare `-fa` that turns it on; off by
    default, and `--flash-attn off` is rejected), or "none" (no such option: always off)."""
    try:
        done = subprocess.run([binary, "--help"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return "value"  # cannot tell: today's syntax
    text = (done.stdout + done.stderr).decode("utf-8", "replace")
    if _FA_VALUES.search(text):
        return "value"
    if any(_FA_ANY.search(line) for line in text.splitlines()):
        return "switch"
    return "none" if "usage" in text.lower() else "value"


def flash_attn_off_args(binary: str) -> list[str]:
    """What turns flash attention off for this binary: `--flash-attn off`, or nothing where it is off by default."""
    return ["--flash-attn", "off"] if flash_attn_syntax(binary) == "value" else []


def _adapt(extra: tuple[str, ...], syntax: str) -> list[str]:
    """The user's flash-attention arguments in the syntax of the binary: on a switch-only (2024) build,
    `--flash-attn on` becomes `-fa` and `--flash-attn off` is dropped (off is its default)."""
    if syntax == "value":
        return list(extra)
    out: list[str] = []
    i = 0
    while i < len(extra):
        a = extra[i]
        value = None
        if a in ("-fa", "--flash-attn") and i + 1 < len(extra) and extra[i + 1] in ("on", "off", "auto"):
            value, i = extra[i + 1], i + 2
        elif a.startswith("--flash-attn="):
            value, i = a.split("=", 1)[1], i + 1
        else:
            out.append(a)
            i += 1
            continue
        if value == "on" and syntax == "switch":
            out.append("-fa")
    return out


def command(binary: str, model: str, prompt: str, extra: tuple[str, ...]) -> list[str]:
    """The argument list (no shell); flash attention off unless the user chose, so scores are printed, in the
    syntax the binary takes (flash_attn_syntax)."""
    syntax = flash_attn_syntax(binary)
    args = [binary, "-m", model, "-p", prompt, *_adapt(extra, syntax)]
    if not any(a in ("-fa", "--flash-attn") or a.startswith("--flash-attn=") for a in extra):
        args += flash_attn_off_args(binary)
    return args


# llama.cpp prints while it works: a dot per loaded chunk of the model, then each graph node as it is computed. Five
# minutes without a byte is beyond both for any model a CPU runs; --stall-timeout changes it.
STALL = 300.0
GRACE = 2.0  # seconds: after llama.cpp exited, what is left in the pipe is read; a process it left behind may hold it
TAIL_BYTES = 1 << 16  # of a block, where the last lines (for a failure's message) are looked for
_WAIT = 0.05  # seconds: a read returns what came within this much of the first byte (fewer, larger blocks)


class Tee:
    """A binary stream over the process's output that copies what is read to a file, remembers the last lines, and
    never waits for ever: STALL seconds without output, or GRACE seconds after the process exited, end it."""

    def __init__(self, proc: subprocess.Popen, keep: BinaryIO | None, stall: float, tail_lines: int = 40):
        self._proc, self._keep, self._stall = proc, keep, stall
        self._fd = proc.stdout.fileno()  # type: ignore[union-attr]
        self._tail: deque[bytes] = deque(maxlen=tail_lines)
        self._head: list[bytes] = []  # the first lines: a 2024 build says what it refused, then prints its usage
        self._head_lines = tail_lines
        self._eof = False
        self._pace = Pace()  # llama.cpp writes each number on its own: let the pipe fill rather than wake per write
        enlarge(self._fd)
        self.name = BINARY
        self.stalled: DumpError | None = None

    def read(self, n: int = -1) -> bytes:
        n = n if n > 0 else 1 << 20
        chunks: list[bytes] = []
        got = 0
        while got < n and not self._eof:
            data = self._next(n - got, _WAIT if chunks else None)
            if data is None:  # nothing more within _WAIT of what this read has
                break
            if not data:
                self._eof = True
                break
            chunks.append(data)
            got += len(data)
        data = b"".join(chunks)
        if self._keep is not None and data:
            self._keep.write(data)
        if data:  # the last lines only: splitting a block of millions of short lines would cost as much again
            self._tail.extend(data[-TAIL_BYTES:].splitlines()[-self._tail.maxlen:])
            if len(self._head) < self._head_lines:
                self._head += data[:TAIL_BYTES].splitlines()[:self._head_lines - len(self._head)]
        return data

    def _next(self, n: int, wait: float | None) -> bytes | None:
        """Up to n bytes; None when `wait` passed without any; b"" at the end (the pipe closed, a stall, or the
        process gone GRACE seconds while something else holds the pipe)."""
        self._pace.wait()
        quiet_since = exited = time.monotonic()
        while True:
            ready, _, _ = select.select([self._fd], [], [], min(wait, 1.0) if wait is not None else 1.0)
            if ready:
                data = os.read(self._fd, n)
                self._pace.read(len(data))
                return data
            now = time.monotonic()
            if wait is not None and now - quiet_since >= wait:
                return None
            if self._proc.poll() is None:
                exited = now
                if self._stall and now - quiet_since >= self._stall:
                    self.stalled = DumpError(BINARY, None, f"printed nothing for {self._stall:g} s: ended it "
                                                           "(--stall-timeout SECONDS waits longer; 0 for ever)")
                    return b""
            elif now - exited >= GRACE:
                return b""

    def tail(self) -> str:
        return "\n".join(line.decode("utf-8", "replace") for line in self._tail)

    def head(self) -> str:
        return "\n".join(line.decode("utf-8", "replace") for line in self._head)


class Process:
    """The running llama-eval-callback: `.stream` is its merged stdout+stderr (as `2>&1` gives). It runs in a
    process group of its own, which leaving the `with` block ends, however attncheck ends (Ctrl-C included): no
    orphan keeps computing."""

    def __init__(self, args: list[str], keep: str | None, stall: float = STALL):
        try:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as e:
            raise DumpError(args[0], None, f"cannot start: {e.strerror}") from None
        self._stall = stall
        self._keep = open(keep, "wb") if keep else None
        self.stream = Tee(self._proc, self._keep, stall)

    def __enter__(self) -> "Process":
        return self

    def __exit__(self, *_) -> None:
        self.end()

    def finish(self) -> int:
        """Read what is left (the checker may stop early), wait, and return the exit code. A process that closed
        its output but keeps running is waited for the stall timeout, then ended (self.stream.stalled says so)."""
        while self.stream.read(1 << 20):
            pass
        if self.stream.stalled is None:
            try:
                self._proc.wait(timeout=self._stall or None)
            except subprocess.TimeoutExpired:
                self.stream.stalled = DumpError(BINARY, None, f"closed its output but kept running for "
                                                              f"{self._stall:g} s: ended it (--stall-timeout SECONDS "
                                                              "waits longer)")
        if self.stream.stalled is not None:
            self.end()
        code = self._proc.wait()
        if self._keep is not None:
            self._keep.close()
        return code

    def end(self) -> None:
        """End the process group (llama.cpp and whatever it started): SIGTERM, then SIGKILL after 2 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self._proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                self._proc.wait(timeout=2)
                os.killpg(self._proc.pid, 0)  # the leader is gone; others of its group may be left
            except subprocess.TimeoutExpired:
                continue
            except (ProcessLookupError, PermissionError):
                break
        if self._proc.stdout is not None:
            self._proc.stdout.close()

    def failure(self, code: int) -> DumpError:
        """The exit code and, on the one line, llama.cpp's error lines (dump/llama_log.py), else its last lines."""
        from ..dump.llama_log import error_lines

        last = self.stream.tail().split("\n")
        errors = error_lines(self.stream.head().split("\n") + last)  # each line once: the two may overlap
        shown = errors or [ln.strip() for ln in last if ln.strip()][-3:]
        said = ("it said: " if errors else "its last lines: ") + " | ".join(shown) if shown else \
            "it printed nothing (llama.cpp's logger can lose its output at exit)"
        return DumpError(BINARY, None, f"exited with code {code}; {said}")


def run_llama(model, prompt: str, llama_args: tuple[str, ...] = (), *, binary: str | None = None,
              keep: str | None = None, dump_only: bool = False, stall: float = STALL, observe=None, **options):
    """`attncheck run -m MODEL -p PROMPT [-- LLAMA_ARGS]` for Python: run llama-eval-callback and check its output
    as it streams; the report.Report its JSON is made from (`.to_dict()`, `.exit_code`). The printed numbers
    are checked against the model's reference forward pass too unless dump_only (or attncheck has none for its
    architecture: a warning in the report says so). llama_args go to llama.cpp (flash attention off unless they set
    it); options are verify.Options' (layers=, heads=, kq_scale=, tokens=, jobs=, ...); observe: verify's. A model
    that is not a regular file is a ModelError before llama.cpp starts; a binary that cannot start, fails or
    stalls `stall` seconds, a DumpError naming it (and what it said). model: a path, or the context a command opened
    (arch/context.py)."""
    from ..arch.context import model_path, open_model
    from ..arch.header import require_shape
    from ..verify import Options, verify

    path = model_path(model)
    if not os.path.isfile(path):  # before llama.cpp starts: it would wait on a FIFO for ever, read a folder as nothing
        raise ModelError(path, "no such file" if not os.path.exists(path) else "not a regular file")
    reference, why_not = (None if dump_only else model), ""
    if reference is not None:
        try:
            reference = open_model(reference)  # its header read once (or as the command opened it)
            require_shape(reference.meta, reference.path)
        except ModelError as e:  # llama.cpp may still run it: check from the dump alone
            reference, why_not = None, f"no --model checks: {e}"
    opts = Options(**{"require_ids": False, **options, "model": reference})
    proc = Process(command(find_binary(binary), path, prompt, tuple(llama_args)), keep, stall)
    report, error = None, None
    with proc:  # llama.cpp's process group ends with this block, whatever ends it
        try:
            report = verify(proc.stream, opts, observe=observe)
        except (DumpError, ModelError) as e:
            error = e
        code = proc.finish()
    if proc.stream.stalled is not None:
        raise proc.stream.stalled
    if code != 0:
        raise proc.failure(code)
    if error is not None:
        raise error
    if why_not:
        report.warnings.insert(0, why_not)
    return report

