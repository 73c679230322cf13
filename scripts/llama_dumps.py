"""llama-eval-callback dumps for `make llama-mutants`: made once per binary, model, prompt and flags, and compared.

A dump is the merged stdout and stderr of `BIN -m MODEL -p PROMPT -t 2 --seed 1 FLAGS`. llama.cpp's asynchronous
logger loses a varying tail of that output at exit; a dump is kept only once a run printed the whole graph, up to
the logits (`result_output` and its `sum` line), so that every dump of a comparison ends at the same node. After
ATTEMPTS runs without one, the run that printed most is kept and said to be cut.

Dumps are cached in $ATTNCHECK_LLAMA_DIR/mutants/dumps/ under a hash of the binary, the model file, the prompt and
the flags, beside a JSON note of how they were made.
"""
from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import fetch_models

ATTEMPTS = 20
HEADER = re.compile(r"^(?:common_debug_cb_eval|ggml_debug):\s+(.*?) = \(")
LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ [A-Z] ")
NUMBER = re.compile(r"[-+]?(?:nan|inf|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)", re.I)
_hashes: dict[tuple[str, int, float], str] = {}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered for the process by path, size and mtime."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime)
    if key not in _hashes:
        _hashes[key] = fetch_models.sha256(path)
    return _hashes[key]


@dataclass(frozen=True)
class Node:
    """One printed node: its name and every number printed in its body, the `sum` last."""
    name: str
    numbers: tuple[str, ...]
    has_sum: bool


def nodes(text: str) -> list[Node]:
    """The printed nodes of a dump, in order (log lines skipped)."""
    out: list[Node] = []
    name, nums, has_sum = None, [], False
    for line in text.splitlines():
        m = HEADER.match(line)
        if m or LOG_LINE.match(line):
            if name is not None:
                out.append(Node(name, tuple(nums), has_sum))
            name, nums, has_sum = (m.group(1).strip(), [], False) if m else (None, [], False)
            continue
        if name is None:
            continue
        s = line.strip()
        if s.startswith("sum = "):
            has_sum = True
            nums.append(s[6:].strip())
        elif s and s[0] == "[":
            nums.extend(NUMBER.findall(s.replace("...", " ")))
    if name is not None:
        out.append(Node(name, tuple(nums), has_sum))
    return out


def complete(text: str) -> bool:
    """The dump printed the logits to their `sum` line."""
    printed = nodes(text)
    return any(n.name == "result_output" and n.has_sum for n in printed)


def n_tokens(text: str) -> int | None:
    m = re.search(r"number of input tokens = (\d+)", text)
    return int(m.group(1)) if m else None


@dataclass
class Dump:
    path: Path
    complete: bool
    attempts: int
    seconds: float
    tokens: int | None


def make_dump(binary: Path, model: Path, prompt: str, flags: list[str], folder: Path, name: str,
              timeout: int = 1800) -> Dump:
    """The dump of one run of `binary`, from the cache when it was made before."""
    key = hashlib.sha256("\n".join([file_sha256(binary), file_sha256(model), prompt, *flags]).encode()).hexdigest()
    path = folder / f"{name}-{key[:16]}.txt"
    note = path.with_suffix(".json")
    if path.exists() and note.exists():
        return Dump(path=path, **json.loads(note.read_text()))
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    best, best_nodes = b"", -1
    attempts = 0
    for attempts in range(1, ATTEMPTS + 1):
        done = subprocess.run([str(binary), "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1", *flags],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              timeout=timeout)
        text = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{binary} exited {done.returncode} on {model.name} {flags}: {text[-1500:]}")
        if complete(text):
            best = done.stdout
            break
        count = len(nodes(text))
        if count > best_nodes:
            best, best_nodes = done.stdout, count
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(best)
    tmp.rename(path)
    text = best.decode(errors="replace")
    made = Dump(path=path, complete=complete(text), attempts=attempts, seconds=round(time.time() - t0, 2),
                tokens=n_tokens(text))
    note.write_text(json.dumps({k: v for k, v in made.__dict__.items() if k != "path"}) + "\n")
    return made


@dataclass
class Effect:
    """What a bug did to the printed numbers: the largest change of the printed logits relative to the rms of the
    clean dump's printed logits, whether any printed number differs, and the first node that does."""
    logits_rel: float | None
    printed_differs: bool
    first_node: str | None
    nodes_compared: int


def effect(clean: Path, mutant: Path) -> Effect:
    a, b = nodes(clean.read_text(errors="replace")), nodes(mutant.read_text(errors="replace"))
    first = next((x.name for x, y in zip(a, b) if x != y), None)
    if first is None and len(a) != len(b):
        first = (a if len(a) > len(b) else b)[min(len(a), len(b))].name
    logits = [n for n in a if n.name == "result_output"], [n for n in b if n.name == "result_output"]
    rel = None
    if logits[0] and logits[1]:
        x = [float(v) for v in logits[0][-1].numbers[:-1]]
        y = [float(v) for v in logits[1][-1].numbers[:-1]]
        if len(x) == len(y) and x:
            rms = math.sqrt(sum(v * v for v in x) / len(x)) or 1.0
            moves = [abs(p - q) for p, q in zip(x, y)]
            rel = math.inf if any(math.isnan(m) for m in moves) else max(moves) / rms
    return Effect(logits_rel=rel, printed_differs=first is not None, first_node=first,
                  nodes_compared=min(len(a), len(b)))
