"""`make bench`, third part: what piping llama-eval-callback into `attncheck` adds to the run itself.

SmolLM2-135M-Instruct Q4_1 (scripts/fetch_models.py) on the two prompts of bench/model_vs_llama.py (11 tokens, and 52
tokens in 8 ubatches with -ub 7): llama-eval-callback alone, its merged output saved to a file, and the same command
piped into `attncheck` (dump-only check, its report to a file), run alternately in this one script, best wall time of
--repeat runs each. The overhead is (piped − alone) / alone; goal: at most 5%, attncheck is never the slow end of the
pipe.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))
import fetch_models  # noqa: E402
from model_vs_llama import PROMPTS, llama_binary  # noqa: E402

GOAL = 0.05


def alone(llama: list[str], out: Path) -> tuple[float, int]:
    """Wall time and exit code of llama-eval-callback with stdout and stderr in a file, as when saving a dump."""
    with open(out, "wb") as sink:
        t0 = time.perf_counter()
        code = subprocess.run(llama, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        return time.perf_counter() - t0, code


def piped(llama: list[str], out: Path) -> tuple[float, int, int, float]:
    """Wall time of `llama ... 2>&1 | attncheck` until both have exited, both exit codes, and attncheck's CPU time
    (user + system: what it took from the cores llama.cpp runs on, less noisy than wall time on a busy machine)."""
    with open(out, "wb") as sink:
        t0 = time.perf_counter()
        first = subprocess.Popen(llama, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        second = subprocess.Popen([sys.executable, "-m", "attncheck"], stdin=first.stdout, stdout=sink,
                                  stderr=subprocess.STDOUT)
        first.stdout.close()  # the pipe's read end now belongs to attncheck alone
        _, status, usage = os.wait4(second.pid, 0)
        code_llama = first.wait()
        wall = time.perf_counter() - t0
        second.returncode = os.waitstatus_to_exitcode(status)
        return wall, code_llama, second.returncode, usage.ru_utime + usage.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "build"), help="folder for the dumps and reports")
    args = ap.parse_args()
    binary, model = llama_binary(), fetch_models.smollm2()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    print(f"llama-eval-callback alone and piped into attncheck: {model.name}, best of {args.repeat}, alternating")
    ok = True
    for i, (what, prompt, flags) in enumerate(PROMPTS):
        llama = [binary, "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1", "--flash-attn", "off", *flags]
        solo, pipe, cpu, codes = [], [], [], set()
        for _ in range(args.repeat):
            t, c = alone(llama, out / f"pipe-bench-{i}.txt")
            solo.append(t)
            t, c1, c2, used = piped(llama, out / f"pipe-bench-{i}.report")
            pipe.append(t)
            cpu.append(used)
            codes |= {("llama alone", c), ("llama piped", c1), ("attncheck", c2)}
        over = min(pipe) / min(solo) - 1
        bad = sorted(f"{who} exit {c}" for who, c in codes if c != 0)
        ok &= over <= GOAL and not bad
        print(f"  {what}: llama-eval-callback alone {min(solo):.2f} s (runs {', '.join(f'{t:.2f}' for t in solo)}), "
              f"piped into attncheck {min(pipe):.2f} s (runs {', '.join(f'{t:.2f}' for t in pipe)}); "
              f"overhead {100 * over:+.1f}% (goal <= {100 * GOAL:.0f}%); attncheck's CPU time {min(cpu):.2f} s "
              f"({100 * min(cpu) / min(solo):.0f}% of llama-eval-callback's wall time alone)"
              f"{'; ' + ', '.join(bad) if bad else ''}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
