"""llama.cpp's own error lines in a log: what a run that stopped before computing anything (a refused option, a
model that would not load) said, for the one-line error that reports it.

Today's llama.cpp prefixes each log line with its level (`E` for an error, after a timestamp when timestamps are on:
`0.00.737.425 E llama_init_from_model: quantized V cache requires flash_attn to be enabled`, common/log.cpp); 2024's
and the argument parser print plain lines (`llama_init_from_gpt_params: error: failed to create context with model
...`, `error: invalid argument: --junit`, `main : failed to init`).
"""
from __future__ import annotations

import re

_LEVEL_E = re.compile(r"^(?:\d+(?:\.\d+)+ )?E (\S.*)$")  # today's error level, after an optional timestamp
# a plain log line of llama.cpp's: `function: what` or `main : what`, speaking of an error
_PLAIN = re.compile(r"^(?=[A-Za-z_]\w* ?: ).*\b(?:error|failed|failure|invalid|unknown argument|"
                    r"requires|cannot|unable|no such)\b", re.IGNORECASE)
MAX_LINES = 6  # of llama.cpp's error lines quoted: the first ones say why, the last what it did then


def error_lines(lines: list[str]) -> list[str]:
    """The error lines of a log, in order, each once: today's level-E lines (without their timestamp) when there are
    any, else plain log lines (`function: what`; never a printed tensor row, which starts with a blank) that speak of
    an error."""
    levelled = [f"E {m.group(1).rstrip()}" for m in map(_LEVEL_E.match, lines) if m]
    found = levelled or [line.rstrip() for line in lines if _PLAIN.match(line)]
    found = list(dict.fromkeys(found))
    if len(found) > MAX_LINES:
        found = [*found[:MAX_LINES - 1], f"(… {len(found) - MAX_LINES} more)", found[-1]]
    return found


def said(lines: list[str]) -> str:
    """llama.cpp's error lines as one line ('' when it printed none): `E a | E b`."""
    return " | ".join(error_lines(lines))
