"""`attncheck run`: start llama-eval-callback and check its output as it streams, optionally keeping a copy."""
from __future__ import annotations

import os
import shutil
import subprocess
from collections import deque
from typing import BinaryIO

from .errors import DumpError

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


def command(binary: str, model: str, prompt: str, extra: tuple[str, ...]) -> list[str]:
    """The argument list (no shell); flash attention off unless the user chose, so scores are printed."""
    args = [binary, "-m", model, "-p", prompt, *extra]
    if not any(a in ("-fa", "--flash-attn") or a.startswith("--flash-attn=") for a in extra):
        args += ["--flash-attn", "off"]
    return args


class Tee:
    """A binary stream that copies what is read from the process to a file and remembers the last lines."""

    def __init__(self, stream: BinaryIO, keep: BinaryIO | None, tail_lines: int = 12):
        self._stream, self._keep = stream, keep
        self._tail: deque[bytes] = deque(maxlen=tail_lines)
        self.name = BINARY

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        if self._keep is not None and data:
            self._keep.write(data)
        if data:
            self._tail.extend(data.splitlines()[-self._tail.maxlen:])
        return data

    def tail(self) -> str:
        return "\n".join(line.decode("utf-8", "replace") for line in self._tail)


class Process:
    """The running llama-eval-callback: `.stream` is its merged stdout+stderr (as `2>&1` gives)."""

    def __init__(self, args: list[str], keep: str | None):
        try:
            self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL)
        except OSError as e:
            raise DumpError(args[0], None, f"cannot start: {e.strerror}") from None
        self._keep = open(keep, "wb") if keep else None
        self.stream = Tee(self._proc.stdout, self._keep)  # type: ignore[arg-type]

    def finish(self) -> int:
        """Read what is left (the checker may stop early), wait, and return the exit code."""
        while self.stream.read(1 << 20):
            pass
        code = self._proc.wait()
        if self._keep is not None:
            self._keep.close()
        return code

    def failure(self, code: int) -> DumpError:
        tail = self.stream.tail()
        said = f"its last lines:\n{tail}" if tail.strip() else "it printed nothing (llama.cpp's logger can lose its output at exit)"
        return DumpError(BINARY, None, f"exited with code {code}; {said}")
