"""No single wrong value passes where few rows tell the attention facts apart: real llama.cpp runs of every
architecture of the e2e set with prompts of 2 and 3 tokens, one query per ubatch (-ub 1) and two (-ub 2), where
every printed row's visible slots are all printed (so every weight and every kqv element is checkable from the dump
alone). Each single-value fault of the first softmax layer (a masked weight set to 0.01, a visible weight moved by
0.002 towards 0.5, a kqv element moved by 0.01) must fail `check` and `diff CLEAN FAULTY` (exit 1); the clean dumps
pass both.

By default every ATTNCHECK_FAULT_STRIDE-th fault (15) is tried, which keeps CI short; set it to 1 for all of them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from pipeline import BIN
from test_architectures import ENCODERS, FACTS, dump, models  # noqa: F401  (the models fixture)

import attncheck
from attncheck.diff.compare import diff

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dumpedit import DumpEdit, single_faults  # noqa: E402

pytestmark = pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")

STRIDE = int(os.environ.get("ATTNCHECK_FAULT_STRIDE", "15"))
RUNS = [("How are", ()), ("How are you", ("-ub", "1")), ("How are you", ("-ub", "2"))]


def _exit(path: Path) -> int:
    return attncheck.verify(attncheck.read_dump(str(path)), jobs=1).exit_code


def _diff_exit(old: Path, new: Path) -> int:
    return diff(str(old), str(new), jobs=1).exit_code


def faults(path: Path) -> list[tuple[str, int, tuple[int, int, int], float]]:
    """Every single-value fault of the first softmax layer's weights and kqv, in every evaluation."""
    e = DumpEdit(path, path)
    layer = next(k for k in range(8) if e.headers(f"kq_soft_max-{k}"))
    return single_faults(e, f"kq_soft_max-{layer}", f"kqv-{layer}")


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_single_fault_fails(name, models, tmp_path):  # noqa: F811
    missed, tried = [], 0
    for prompt, flags in RUNS:
        if flags and name in ENCODERS:
            continue  # llama.cpp cannot split an encoder's batch
        clean = dump(models, name, prompt, "--flash-attn", "off", *flags, into=tmp_path)
        assert _exit(clean) == 0 and _diff_exit(clean, clean) == 0, (name, prompt, flags)
        for node, occ, index, new in faults(clean)[::STRIDE]:
            e = DumpEdit(clean, tmp_path / "fault.txt")
            e.set(node, index, new, occ)
            faulty = e.save()
            tried += 1
            codes = (_exit(faulty), _diff_exit(clean, faulty))
            if codes != (1, 1):
                missed.append((prompt, flags, node, occ, index, new, codes))
    assert tried and not missed, missed[:10]
