"""Real llama.cpp bugs, in CI: three patches of tests/llama_mutants/ (cheap to rebuild: one object each, 7-22 s)
built into llama-eval-callback by scripts/llama_rebuild.py, their dumps made by scripts/llama_dumps.py, and attncheck
run on them as `make llama-mutants` runs it (scripts/llama_mutants.py). Each bug is caught (exit 1) by the mode
named for it; the control, the three patches' objects recompiled without them, passes (exit 0) those modes on
those dumps.

- softmax-exp-f16 (ggml-cpu/vec.cpp): softmax's exp rounded through f16; dump-only `check` recomputes the
  weights from the printed scores.
- rope-base-local (models/gemma3.cpp): the windowed layers rotated with the global RoPE base; before the scores,
  where dump-only `check` cannot see, `check --model` (the reference forward pass) does.
- softcap-dropped (models/gemma2.cpp): gemma2's attention soft-cap never applied; `diff` of the control's dump and
  the mutant's, whose graphs and scores differ.

The build folder of scripts/build_llama.sh (beside $LLAMA_EVAL_CALLBACK) is needed; without it these tests skip.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from pipeline import BIN

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import llama_mutants  # noqa: E402
import llama_rebuild  # noqa: E402

BUILD = llama_rebuild.Build(Path(BIN).resolve().parent.parent) if BIN else None
HAVE_BUILD = bool(BUILD and (BUILD.build / "compile_commands.json").exists())
pytestmark = pytest.mark.skipif(not HAVE_BUILD, reason="needs the llama.cpp build folder of scripts/build_llama.sh "
                                                       "beside $LLAMA_EVAL_CALLBACK (make e2e builds it)")

# bug: (dump of scripts/llama_mutants.py's DUMPS, the mode that must catch it)
CASES = {
    "softmax-exp-f16": ("smollm2", "check"),
    "rope-base-local": ("gemma3", "check --model"),
    "softcap-dropped": ("gemma2", "diff"),
}


@pytest.fixture(scope="module")
def harness():
    return llama_mutants.Harness(ROOT, BUILD, log=lambda msg: None)


@pytest.fixture(scope="module")
def binaries(harness):
    """The control and each mutant, built once (cached by patch hash in the build's mutants folder)."""
    chosen = {b.name: b for b in llama_mutants.bugs(list(CASES))}
    patches = [chosen[n].path.read_bytes() for n in CASES]
    control = harness.build.binary(patches[0], clean=True, also=patches[1:])
    return control, {n: harness.build.binary(chosen[n].path.read_bytes()) for n in CASES}, chosen


@pytest.mark.parametrize("name", list(CASES))
def test_bug_is_caught(name, harness, binaries):
    control, mutants, chosen = binaries
    dump, mode = CASES[name]
    rows = {r["mode"]: r for r in llama_mutants.rows_for(harness, chosen[name], dump, control, mutants[name],
                                                         modes=(mode,))}
    r = rows[mode]
    assert r["printed_differs"], f"{name} changed no printed number on {dump}"
    assert r["exit"] == 1, r["verdict"]


@pytest.mark.parametrize("dump", sorted({d for d, _ in CASES.values()}))
def test_control_passes(dump, harness, binaries):
    control, _, _ = binaries
    modes = [m for d, m in CASES.values() if d == dump]
    for r in llama_mutants.rows_for(harness, None, dump, control, harness.build.base_binary(), modes=modes):
        assert r["exit"] == 0, f"{r['mode']} on the control's {dump} dump: {r['verdict']}"
