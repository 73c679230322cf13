"""`make bench`: time and peak memory of `attncheck check` and `list` on the 48-layer benchmark dump and on nine runs
of it one after another (313 MB), of `diff` of the dump with itself, with one process and with every core, and of
`check --model`.

Figures are ratios against a baseline run in the same script (a bare Python line count of the same file),
because these machines are noisy; each command runs as its own subprocess, best of --repeat runs, and the commands
of one dump are run in turn, round after round, so that a slow minute falls on all of them alike.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
DUMP = ROOT / "bench" / "gpt2-deep-48l.txt.xz"  # shipped in the repository: 2.2 MB, 35 MB unpacked
BASELINE = 'import sys; sum(1 for _ in open(sys.argv[1], "rb"))'


def unpack(xz: Path) -> Path:
    out = BUILD / xz.name.removesuffix(".xz")
    if not out.exists() or out.stat().st_mtime < xz.stat().st_mtime:
        BUILD.mkdir(exist_ok=True)
        with lzma.open(xz) as src, open(out.with_suffix(".tmp"), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        out.with_suffix(".tmp").rename(out)
    return out


def concatenated(dump: Path, copies: int) -> Path:
    """The dump repeated: that many llama.cpp runs one after another, as `cat a b` of two logs gives."""
    out = BUILD / f"{dump.stem}-x{copies}{dump.suffix}"
    if not out.exists() or out.stat().st_size != copies * dump.stat().st_size:
        with open(out, "wb") as dst:
            for _ in range(copies):
                with open(dump, "rb") as src:
                    shutil.copyfileobj(src, dst, 1 << 20)
    return out


def tree_pss(pid: int) -> float:
    """Proportional set size (MB) of a process and all its descendants, from /proc (0 where /proc is not there).
    PSS, not RSS: forked workers share the parent's pages, and RSS would count each shared page once per process."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            continue
    return total / 1024


def measure(cmd: list[str], repeat: int, out: Path | None = None) -> tuple[float, float, int]:
    """Best wall time (s) of `repeat` runs, the peak memory (MB) of the whole process tree in one more run (PSS summed
    over the processes, sampled every 5 ms; not wait4's ru_maxrss, which counts the pages the child shared with this
    script between fork and exec), and the exit code of the fastest run; stdout and stderr to `out` if given. The
    timed runs are not sampled: reading smaps_rollup every 5 ms costs the kernel a walk of the page tables each
    time, which took a minute and more of system time from the cores the measured runs need."""
    return measure_in_turn({"": cmd}, repeat, out)[""]


def measure_in_turn(cmds: dict[str, list[str]], repeat: int,
                    out: Path | None = None) -> dict[str, tuple[float, float, int]]:
    """measure() of several commands taken in turn, round after round, so that a slow minute of a noisy machine falls
    on all of them alike and their ratios hold (one command's runs back to back can all land in one)."""
    best = {k: (float("inf"), 0) for k in cmds}
    for _ in range(repeat):
        for k, cmd in cmds.items():
            best[k] = min(best[k], _run(cmd, out, None))
    got = {}
    for k, cmd in cmds.items():
        peak = [0.0]
        _run(cmd, out, peak)
        got[k] = (best[k][0], peak[0], best[k][1])
    return got


def _run(cmd: list[str], out: Path | None, peak: list[float] | None) -> tuple[float, int]:
    """One run: (wall time, exit code); with `peak`, its tree's PSS sampled into peak[0]."""
    done = threading.Event()
    with open(out or os.devnull, "wb") as sink:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT if out else subprocess.DEVNULL)
        sampler = None
        if peak is not None:
            def sample() -> None:
                while not done.wait(0.005):
                    peak[0] = max(peak[0], tree_pss(proc.pid))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
        _, status, _ = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        done.set()
        if sampler is not None:
            sampler.join()
    return wall, os.waitstatus_to_exitcode(status)


def line(label: str, run: tuple[float, float, int], base: float, start: float, sites: int) -> str:
    wall = run[0] - start
    return (f"  {label:<24} {run[0]:7.3f} s  (minus start-up {wall:7.3f} s = {wall / base:5.2f}x the line count)  "
            f"peak memory {run[1]:6.0f} MB  {sites / max(wall, 1e-9):7.0f} sites/s  exit {run[2]}")


def bench_dump(dump: Path, repeat: int, jobs: int) -> tuple[float, int, float, float]:
    """Start-up, line count, attncheck check and list with -j 1 and -j jobs on one dump, in turn; returns check's
    -j jobs wall time, the worst exit code, the line count's time and the start-up."""
    doc = json.loads(subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--json", "-"],
                                    capture_output=True, text=True).stdout)
    t, sites = doc["totals"], doc["totals"]["sites"]
    cmds = {"start": [sys.executable, "-m", "attncheck", "--version"],
            "base": [sys.executable, "-c", BASELINE, str(dump)]}
    for j in (1, jobs):
        cmds[f"check -j {j}"] = [sys.executable, "-m", "attncheck", "check", str(dump), "--quiet", "-j", str(j)]
        cmds[f"list -j {j}"] = [sys.executable, "-m", "attncheck", "list", str(dump), "--json", os.devnull, "-j", str(j)]
    got = measure_in_turn(cmds, repeat)
    start, base = got["start"][0], got["base"]
    print(f"{dump.name}: {dump.stat().st_size / 1e6:.1f} MB, {doc['evaluations']} evaluations, {sites} sites; "
          f"{t['softmax_rows_checked']} softmax rows, {t['softmax_ratio_elements_checked']} weight ratios, "
          f"{t['masked_weights_checked']} masked weights, {t['kqv_elements_checked']} kqv elements; "
          f"verdict {doc['verdict']}")
    print(f"  {'start-up (--version)':<24} {start:7.3f} s")
    print(f"  {'bare line count':<24} {base[0]:7.3f} s  peak memory {base[1]:6.0f} MB")
    for k in ("check -j 1", f"check -j {jobs}", "list -j 1", f"list -j {jobs}"):
        print(line(f"attncheck {k}", got[k], base[0], start, sites))
    return got[f"check -j {jobs}"][0] - start, max(v[2] for k, v in got.items() if k != "start"), base[0], start


def bench_diff(dump: Path, repeat: int, start: float, jobs: int, base: float) -> int:
    """diff of the dump with itself (both sides read and every printed element compared), -j 1 and every core;
    `base`: the line count of one side, as bench_dump measured it."""
    print(f"diff {dump.name} {dump.name}: both sides {2 * dump.stat().st_size / 1e6:.1f} MB; ratios against the line "
          f"count of one side ({base:.3f} s)")
    codes = []
    for j in (1, jobs):
        run = measure([sys.executable, "-m", "attncheck", "diff", str(dump), str(dump), "--quiet", "-j", str(j)], repeat)
        wall = run[0] - start
        print(f"  {f'attncheck diff -j {j}':<24} {run[0]:7.3f} s  (minus start-up {wall:7.3f} s = "
              f"{wall / base:5.2f}x the line count)  peak memory {run[1]:6.0f} MB  exit {run[2]}")
        codes.append(run[2])
    return max(codes)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dump", nargs="?", default=str(DUMP))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--copies", type=int, default=9, help="runs in the large dump (9 make about 313 MB); 1: skip it")
    args = ap.parse_args()
    src = Path(args.dump)
    if not src.exists():
        print(f"bench: {src} not found (the benchmark dump ships as bench/{DUMP.name})", file=sys.stderr)
        return 2
    dump = unpack(src) if src.suffix == ".xz" else src
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    print(f"{jobs} cores; times are the best of {args.repeat} runs, each command in its own process, the commands of "
          "one dump in turn; ratios against a bare Python line count of the same file, after start-up")
    small, code, base, start = bench_dump(dump, args.repeat, jobs)
    if args.copies > 1:
        big = concatenated(dump, args.copies)
        large, code_big, _, _ = bench_dump(big, args.repeat, jobs)
        code = max(code, code_big)
        print(f"growth: x{large / max(small, 1e-9):.2f} the time (minus start-up) for x{args.copies} the input")
    code = max(code, bench_diff(dump, max(1, args.repeat // 2), start, jobs, base))
    code = max(code, model_bench(args.repeat))
    return 0 if code == 0 else 1


def model_bench(repeat: int) -> int:
    """`check --model` on the largest shipped dump whose log holds its token ids, with the model that made it."""
    fixtures = ROOT / "fixtures"
    entries = [json.loads(line) for line in (fixtures / "MANIFEST.jsonl").read_text().splitlines() if line.strip()]
    entries = [e for e in entries if not e["dump"].startswith("old-")]  # the older format needs --tokens
    e = max(entries, key=lambda e: (fixtures / e["dump"]).stat().st_size)
    dump, model = fixtures / e["dump"], fixtures / "models" / e["model"]
    plain = measure([sys.executable, "-m", "attncheck", "check", str(dump), "--quiet"], repeat)
    timed = measure([sys.executable, "-m", "attncheck", "check", str(dump), "--quiet", "--model", str(model)], repeat)
    doc = json.loads(subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--json", "-",
                                     "--model", str(model)], capture_output=True, text=True).stdout)
    t, sites = doc["totals"], doc["totals"]["sites"]
    print(f"check --model: {dump.name} ({dump.stat().st_size / 1e3:.0f} kB, the largest shipped dump) with {model.name}: "
          f"{doc['evaluations']} evaluations x {sites // max(doc['evaluations'], 1)} layers = {sites} sites")
    print(f"  {t['model_elements_checked']} printed elements of {t['model_nodes_checked']} nodes and "
          f"{t['model_sums_checked']} sums against the reference; verdict {doc['verdict']}")
    print(f"  attncheck check --model:      {timed[0]:.3f} s, peak memory {timed[1]:.0f} MB, exit {timed[2]}; "
          f"{1000 * timed[0] / sites:.0f} ms per evaluation x layer")
    print(f"  the same without --model:     {plain[0]:.3f} s ({1000 * (timed[0] - plain[0]) / sites:.0f} ms per "
          "evaluation x layer for the model)")
    print("  check --model on the 48-layer benchmark dump: not measured. Its random model is not shipped and cannot be "
          "rebuilt exactly (seed and settings unknown); a model made anew would not be the one that made the dump.")
    return timed[2]


if __name__ == "__main__":
    sys.exit(main())
