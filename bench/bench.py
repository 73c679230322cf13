"""`make bench`: time and peak memory of `attncheck check` on the 48-layer benchmark dump.

Figures are ratios against a baseline run in the same script (a bare Python line count of the same file),
because these machines are noisy; each command runs as its own subprocess, best of --repeat runs.
"""
from __future__ import annotations

import argparse
import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
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


def measure(cmd: list[str], repeat: int, out: Path | None = None) -> tuple[float, float, int]:
    """Best wall time (s), peak RSS (MB) of that run, and its exit code; stdout and stderr to `out` if given."""
    best = (float("inf"), 0.0, 0)
    for _ in range(repeat):
        with open(out or os.devnull, "wb") as sink:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT if out else subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t0
        if wall < best[0]:
            best = (wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("dump", nargs="?", default=str(ROOT.parent / "shared" / "bench" / "gpt2-deep-48l.txt.xz"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--copies", type=int, default=9, help="runs in the large dump (9 make about 313 MB); 1: skip it")
    args = ap.parse_args()
    src = Path(args.dump)
    if not src.exists():
        print(f"bench: {src} not found (the benchmark dump ships in shared/bench/)", file=sys.stderr)
        return 2
    dump = unpack(src) if src.suffix == ".xz" else src
    size = dump.stat().st_size / 1e6
    base = measure([sys.executable, "-c", BASELINE, str(dump)], args.repeat)
    check = measure([sys.executable, "-m", "attncheck", "check", str(dump), "--quiet"], args.repeat)
    doc = json.loads(subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--json", "-"],
                                    capture_output=True, text=True).stdout)
    t = doc["totals"]
    print(f"dump: {dump.name}, {size:.1f} MB, {doc['evaluations']} evaluations, {t['sites']} attention sites")
    print(f"checked: {t['softmax_rows_checked']} softmax rows, {t['softmax_ratio_elements_checked']} weight ratios, "
          f"{t['masked_weights_checked']} masked weights, {t['kqv_elements_checked']} kqv elements, "
          f"{t['sums_checked']} sums; verdict {doc['verdict']}")
    print(f"baseline (python line count): {base[0]:.3f} s, peak RSS {base[1]:.0f} MB")
    print(f"attncheck check --quiet:      {check[0]:.3f} s, peak RSS {check[1]:.0f} MB, exit {check[2]}")
    print(f"ratio attncheck / baseline:   {check[0] / base[0]:.2f}  (target <= 5; peak RSS target <= 150 MB)")
    if args.copies > 1:
        big = concatenated(dump, args.copies)
        large = measure([sys.executable, "-m", "attncheck", "check", str(big), "--quiet"], 1)
        big_base = measure([sys.executable, "-c", BASELINE, str(big)], 1)
        print(f"large: {big.name}, {big.stat().st_size / 1e6:.0f} MB ({args.copies} runs of the dump above)")
        print(f"attncheck check --quiet:      {large[0]:.3f} s, peak RSS {large[1]:.0f} MB, exit {large[2]}")
        print(f"growth vs {size:.0f} MB:            time x{large[0] / check[0]:.2f} for x{args.copies} the input "
              f"(baseline x{big_base[0] / base[0]:.2f}); peak RSS x{large[1] / check[1]:.2f}")
        print(f"ratio attncheck / baseline:   {large[0] / big_base[0]:.2f}")
    code = model_bench(args.repeat)
    return 0 if check[2] == 0 and code == 0 else 1


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
    print(f"  attncheck check --model:      {timed[0]:.3f} s, peak RSS {timed[1]:.0f} MB, exit {timed[2]}; "
          f"{1000 * timed[0] / sites:.0f} ms per evaluation x layer")
    print(f"  the same without --model:     {plain[0]:.3f} s ({1000 * (timed[0] - plain[0]) / sites:.0f} ms per "
          "evaluation x layer for the model)")
    print("  check --model on the 48-layer benchmark dump: not measured. Its random model is not shipped and cannot be "
          "rebuilt exactly (seed and settings unknown); a model made anew would not be the one that made the dump.")
    return timed[2]


if __name__ == "__main__":
    sys.exit(main())
