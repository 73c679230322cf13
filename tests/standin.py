"""A stand-in for llama-eval-callback (a shell script) that writes down how it was started and prints a real dump or
a real refusal of llama.cpp's: for what attncheck passes to llama.cpp and how it reads the answer, which the real
binary would not record (tests/e2e/test_llama_cpp.py runs the real one)."""
from __future__ import annotations

from pathlib import Path

HELP = "[ \"$1\" = --help ] && { echo '--flash-attn [on|off|auto]'; exit 0; }\n"


def stand_in(tmp_path: Path, prints: Path, code: int = 0) -> tuple[Path, Path]:
    """A llama-eval-callback that records each start (its arguments, one per line) and prints `prints`."""
    args = tmp_path / "args"
    script = tmp_path / "llama-eval-callback"
    script.write_text(f"#!/bin/sh\necho started >> '{tmp_path / 'starts'}'\n" + HELP
                      + f"printf '%s\\n' \"$@\" > '{args}'\ncat '{prints}'\nexit {code}\n")
    script.chmod(0o755)
    return script, args
