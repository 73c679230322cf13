"""`attncheck run`: start llama-eval-callback and check its output as it streams, optionally keeping a copy."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import deque
from functools import lru_cache
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
