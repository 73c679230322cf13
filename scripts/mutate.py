"""`make mutate`: put one plausible bug at a time into a copy of attncheck, run the tests against it, and print which
mutants the tests caught (killed) and which they did not (survived).

Each mutant is one small textual replacement in one file of the package. It is applied to a copy of the package and
the tests in a temporary folder (the fixtures are linked, not copied); this repository's own files are never
edited. A replacement that no longer matches the code exactly once stops the run: mutants follow the code they
break. First the unmutated copy runs the same tests: a mutant counts only against a suite that passes.

    python3 scripts/mutate.py                    # every mutant, each against the tests that exercise its stage
    python3 scripts/mutate.py --full             # every mutant against the whole unit suite (slow)
    python3 scripts/mutate.py --only gqa-mod -v  # one mutant, naming the tests that failed
    python3 scripts/mutate.py --tests tests/test_bounds.py      # every mutant against one test file
    python3 scripts/mutate.py --list

Not part of `make test` or CI: a run takes minutes per mutant.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIN_KILLS = 3  # a mutant caught by fewer tests is reported as weakly killed

# the tests that exercise each stage (--full runs the whole unit suite instead)
CHECK = ("tests/test_bounds.py", "tests/test_mutations.py", "tests/test_properties.py", "tests/test_inspect.py",
         "tests/test_dumps.py", "tests/test_totals.py")
DIFF = ("tests/test_diff.py",)
MODEL = ("tests/test_model.py", "tests/test_reference.py", "tests/test_bounds.py")


@dataclass(frozen=True)
class Mutant:
    name: str
    about: str
    path: str  # inside attncheck/
    old: str
    new: str
    tests: tuple[str, ...]


MUTANTS = [
    # --- the dump-only checks ---
    Mutant("masked-1e-3", "masked weights accepted up to 1e-3 (they must print exactly 0)", "check/checks.py",
           "return Elements(got, np.zeros_like(got), np.zeros_like(got), s, h, t, j,",
           "return Elements(got, np.zeros_like(got), np.full_like(got, 1e-3), s, h, t, j,", CHECK),
    Mutant("pv-bound-x10", "the P·V bound ×10", "check/bounds.py",
           "    return (\n        PRINT\n", "    return 10 * (\n        PRINT\n", CHECK),
    Mutant("pv-bound-x100", "the P·V bound ×100", "check/bounds.py",
           "    return (\n        PRINT\n", "    return 100 * (\n        PRINT\n", CHECK),
    Mutant("pv-v-type-ignored", "the P·V bound without P's rounding to an f16 V (u = 0 for every V type)",
           "check/bounds.py", 'u = SRC1_ROUNDING.get(v_type or "f32", 0.0)', "u = 0.0", CHECK),
    Mutant("sum-bound-x100", "the SOFT_MAX sum bound ×100", "check/checks.py",
           "full_bound = precision.sum_bound(", "full_bound = 100 * precision.sum_bound(", CHECK),
    Mutant("ratio-bound-x100", "the softmax-ratio bound ×100", "check/bounds.py",
           "    return PRINT + pred * (PRINT / p_ref + np.expm1(2 * scale * PRINT) + 8 * F32)",
           "    return 100 * (PRINT + pred * (PRINT / p_ref + np.expm1(2 * scale * PRINT) + 8 * F32))", CHECK),
    Mutant("softmax-bound-x10", "the softmax bound ×10", "check/bounds.py",
           "    return PRINT + p * (np.expm1(2 * scale * PRINT) + (np.asarray(n_visible) + 4 + 2 * np.abs(scaled_max)) * F32)",
           "    return 10 * (PRINT + p * (np.expm1(2 * scale * PRINT) + (np.asarray(n_visible) + 4 + 2 * np.abs(scaled_max)) * F32))",
           CHECK),
    Mutant("gqa-mod", "GQA read as KV head h % H_kv (instead of h // (H / H_kv))", "sites/heads.py",
           "    return h // (H // H_kv)", "    return h % H_kv", CHECK),
    Mutant("mask-one-late", "the causal mask lets a query read one slot past its position", "sites/mask.py",
           "out[k_pos[:, None, :] > q_pos[:, :, None]] = LATER",
           "out[k_pos[:, None, :] > q_pos[:, :, None] + 1] = LATER", CHECK),
    Mutant("ratio-ref-argmin", "weight ratios taken against the smallest printed weight, not the largest",
           "check/checks.py", "k = np.where(vis, P, -1.0).argmax(axis=-1)[..., None]",
           "k = np.where(vis, P, 2.0).argmin(axis=-1)[..., None]", CHECK),
    Mutant("n-past-reset", "n_past not carried from one evaluation (ubatch) to the next", "dump/graph.py",
           "else n_past + T", "else 0", CHECK),
    # --- diff ---
    Mutant("diff-tol-x100", "diff's print-precision tolerance (--exact) ×100", "diff/nodes.py",
           "ATOL = 1e-4\nRTOL = 2.0**-16", "ATOL = 1e-2\nRTOL = 100 * 2.0**-16", DIFF),
    Mutant("diff-drift-x10", "diff's drift allowance (A) ×10", "diff/drift.py", "A = 5.0  #", "A = 50.0  #",
           DIFF + ("tests/test_diff_drift.py",)),
    Mutant("prefix-all", "--prefix compares all positions, not only those causality fixes", "diff/pair.py",
           "    if rep.prefix and T_short is not None:\n        keep = causal(",
           "    if False:\n        keep = causal(", DIFF),
    # --- --model ---
    Mutant("ref-no-rope", "the reference forward pass without RoPE", "model/reference.py",
           '        if not self.fw.positions.startswith("rope"):\n            return q, k',
           '        if True:\n            return q, k', MODEL),
    Mutant("ref-no-layernorm", "the reference forward pass without GPT-2's LayerNorm", "model/reference.py",
           "else blocks.layer_norm(x, self.hp.norm_eps)", "else x", MODEL),
    Mutant("model-cascade-x10", "--model's deep-layer allowance (CASCADE) ×10 in layer 1", "model/bounds.py",
           '"values": ((0.008, 0.0422), (0.02, 0.145),',
           '"values": ((0.008, 0.0422), (0.2, 1.45),', MODEL),
    Mutant("model-noise-x10", "--model's layer-0 f32 summation noise ×10", "model/layer0.py",
           "/ 8 + 4) * U32", "/ 8 + 4) * 10 * U32", MODEL),
]


def copy_tree(dst: Path) -> None:
    """The package and the tests, copied; fixtures linked (tests only read them)."""
    shutil.copytree(ROOT / "attncheck", dst / "attncheck", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests", dst / "tests", ignore=shutil.ignore_patterns("__pycache__", "e2e"))
    (dst / "fixtures").symlink_to(ROOT / "fixtures", target_is_directory=True)
    for name in ("pyproject.toml",):
        shutil.copy(ROOT / name, dst / name)


def apply(m: Mutant, root: Path) -> None:
    path = root / "attncheck" / m.path
    code = path.read_text(encoding="utf-8")
    n = code.count(m.old)
    if n != 1:
        raise SystemExit(f"mutant {m.name}: {m.path} holds its text {n} times, not once; update scripts/mutate.py")
    path.write_text(code.replace(m.old, m.new), encoding="utf-8")


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_tests(root: Path, tests: tuple[str, ...], extra: list[str]) -> tuple[int, list[str], str]:
    """pytest in the copy (its own attncheck first on sys.path): exit code, failed test ids, the output's tail."""
    env = {**os.environ, "PYTHONPATH": str(root), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "--ignore=tests/e2e",
           "--hypothesis-profile=mutate", *tests, *extra]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    failed = sorted(set(_FAILED.findall(proc.stdout)))
    return proc.returncode, failed, proc.stdout[-3000:] + proc.stderr[-2000:]


def one(m: Mutant | None, tests: tuple[str, ...], extra: list[str]) -> tuple[Mutant | None, list[str], str, float]:
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="attncheck-mutant-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        if m is not None:
            apply(m, root)
        code, failed, tail = run_tests(root, tests, extra)
    if code not in (0, 1):  # usage error, collection error, crash: no verdict
        raise SystemExit(f"{m.name if m else 'unmutated copy'}: pytest exited {code}\n{tail}")
    return m, failed, tail, time.monotonic() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", metavar="NAME", help="run only these mutants (repeatable)")
    ap.add_argument("--full", action="store_true", help="run the whole unit suite against every mutant")
    ap.add_argument("--tests", action="append", metavar="PATH", help="run these test files or ids instead (repeatable)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="mutants run at once (default 2)")
    ap.add_argument("-v", "--verbose", action="store_true", help="name the tests that failed")
    ap.add_argument("--list", action="store_true", help="list the mutants and stop")
    ap.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -k softmax")
    a = ap.parse_args()
    mutants = [m for m in MUTANTS if not a.only or m.name in a.only]
    if a.only and len(mutants) != len(set(a.only)):
        raise SystemExit(f"unknown mutant; known: {', '.join(m.name for m in MUTANTS)}")
    if a.list:
        for m in MUTANTS:
            print(f"{m.name:20} {m.about}  [{m.path}]")
        return 0
    for m in mutants:  # every replacement still applies, before anything runs
        code = (ROOT / "attncheck" / m.path).read_text(encoding="utf-8")
        if code.count(m.old) != 1:
            raise SystemExit(f"mutant {m.name}: {m.path} holds its text {code.count(m.old)} times, not once")

    subset = lambda m: tuple(a.tests) if a.tests else () if a.full else m.tests  # noqa: E731
    every = tuple(sorted({t for m in mutants for t in subset(m)}))
    _, failed, tail, secs = one(None, every, a.pytest_args)
    if failed:
        print(tail)
        raise SystemExit(f"the unmutated copy fails {len(failed)} tests: fix the suite first")
    print(f"unmutated copy: passes ({secs:.0f} s)", flush=True)

    rows = []
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for m, failed, _, secs in pool.map(lambda m: one(m, subset(m), a.pytest_args), mutants):
            verdict = "survived" if not failed else "killed" if len(failed) >= MIN_KILLS else f"weak (< {MIN_KILLS})"
            rows.append((m, failed, verdict))
            print(f"  {m.name}: {len(failed)} failed ({secs:.0f} s)", flush=True)

    width = max(len(m.name) for m in mutants)
    print(f"\n{'mutant':{width}}  {'failed':>6}  {'verdict':11}  what")
    for m, failed, verdict in rows:
        print(f"{m.name:{width}}  {len(failed):6}  {verdict:11}  {m.about}")
        if a.verbose:
            for t in failed:
                print(f"{'':{width}}          {t}")
    return 0 if all(v == "killed" for _, _, v in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
