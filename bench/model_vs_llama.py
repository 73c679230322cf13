"""`make bench`, second part: `attncheck check --model` beside the llama-eval-callback run it checks, on a real model.

SmolLM2-135M-Instruct Q4_1 (scripts/fetch_models.py) and two prompts: 11 tokens in one evaluation, and 52 tokens in
8 ubatches (-ub 7); and gemma-3-270m Q4_K_M (when scripts/fetch_models.py has fetched it) with a prompt of about 550
tokens in one evaluation (`-c 2048 -b 2048 -ub 2048`), where memory would grow with the prompt if it could. Each command runs as its own process, best wall time of --repeat runs, with the peak memory of
that run (PSS summed over its processes); the ratios are what to compare across machines (both sides run on the same
busy cores). Goals: attncheck's wall time at most 2x llama-eval-callback's, its peak memory at most the model file's
size + 300 MB.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "bench"))
import fetch_models  # noqa: E402
from bench import measure  # noqa: E402
from calibrate import paragraph  # noqa: E402

PROMPTS = [
    ("11 tokens", "The cat sat on the mat because it was tired.", ()),
    ("52 tokens, -ub 7", "The history of the old harbour town began in the twelfth century, when a small group of "
                         "fishermen settled on the banks of the wide river. Over the following centuries it grew into "
                         "a busy port that traded wool, salt and timber with merchants from many distant lands.",
     ("-ub", "7")),
]


LONG = [("~550 tokens, one ubatch", paragraph(30, 3), ("-c", "2048", "-b", "2048", "-ub", "2048"))]


def llama_binary() -> str:
    if os.environ.get("LLAMA_EVAL_CALLBACK"):
        return os.environ["LLAMA_EVAL_CALLBACK"]
    done = subprocess.run([str(ROOT / "scripts" / "build_llama.sh")], capture_output=True, text=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "build"), help="folder for the dumps")
    args = ap.parse_args()
    binary = llama_binary()
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    gemma = getattr(fetch_models, "gemma3_270m", None)
    cases = [(fetch_models.smollm2(), PROMPTS)]
    if gemma is not None:
        try:
            cases.append((gemma(), LONG))
        except RuntimeError as e:
            print(f"gemma-3-270m not benchmarked: {e}")
    else:
        print("gemma-3-270m not benchmarked: scripts/fetch_models.py does not fetch it")
    ok = True
    for model, prompts in cases:
        ok &= bench_model(binary, model, prompts, out, args.repeat)
    return 0 if ok else 1


def bench_model(binary: str, model: Path, prompts, out: Path, repeat: int) -> bool:
    size_mb = model.stat().st_size / 2**20
    print(f"check --model against llama-eval-callback: {model.name} ({size_mb:.0f} MB), best of {repeat}")
    ok = True
    for i, (what, prompt, flags) in enumerate(prompts):
        dump = out / f"{model.stem}-bench-{i}.txt"
        llama = measure([binary, "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1", "--flash-attn", "off",
                         *flags], repeat, dump)
        check = measure([sys.executable, "-m", "attncheck", "check", str(dump), "--model", str(model), "--quiet"],
                        repeat)
        t_ratio, mem_goal = check[0] / llama[0], size_mb + 300
        ok &= llama[2] == 0 and check[2] == 0 and t_ratio <= 2 and check[1] <= mem_goal
        print(f"  {what}: llama-eval-callback {llama[0]:.2f} s, {llama[1]:.0f} MB (exit {llama[2]}); "
              f"attncheck check --model {check[0]:.2f} s, {check[1]:.0f} MB (exit {check[2]})")
        print(f"    time ratio {t_ratio:.2f} (goal <= 2); peak memory {check[1]:.0f} MB (goal <= {mem_goal:.0f} MB: the "
              f"file + 300 MB)")
    return ok


if __name__ == "__main__":
    sys.exit(main())
