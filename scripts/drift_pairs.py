#!/usr/bin/env python3
"""Run the same prompts through two llama.cpp builds and keep each pair of dumps: the material `attncheck diff`'s
drift model is measured on (scripts/drift_calibrate.py) and confirmed on.

    python3 scripts/drift_pairs.py OUTDIR --old OLD_BIN --new NEW_BIN --set calibration NAME=MODEL.gguf ...

Writes OUTDIR/<set>/<NAME>/<case>.old.txt and .new.txt, each the merged output (`2>&1`) of
`llama-eval-callback -m MODEL -p PROMPT -t 2 --seed 1` plus the case's flags, with flash attention off in the
syntax each binary takes (attncheck.run.flash_attn_off_args reads it from `--help`). A run whose output ends
before the last node (today's asynchronous logger loses its tail at exit) is made again, up to 5 times; the
longest output is kept.

The two sets share no (model, prompt) case: calibration measures the allowance, confirmation checks it.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attncheck.run import flash_attn_off_args  # noqa: E402

CAT = "The cat sat on the mat because it was tired."
VERIFY = "We verify every number in the attention head, and we like it."
LONG = ("The history of the old harbour town began in the twelfth century, when a small group of fishermen settled "
        "on the banks of the wide river. Over the following centuries it grew into a busy port that traded wool, salt "
        "and timber with merchants from many distant lands.")
HELLO = "Hello my name is the river bank, and we like money."
BANK = "The bank of the river was too tired, and I like to verify every number in a head."
SETS = {  # case name, prompt, extra flags
    "calibration": [("how-are-you", "How are you", ()), ("cat", CAT, ()),
                    ("draw-ub2", "I like to draw the cat", ("-ub", "2")), ("verify", VERIFY, ()),
                    ("cat-ctk-f32", CAT, ("-ctk", "f32")), ("long-ub7", LONG, ("-ub", "7"))],
    "confirmation": [("hello", HELLO, ()), ("hello-ub3", HELLO, ("-ub", "3")), ("bank-ub5", BANK, ("-ub", "5"))],
}
ATTEMPTS = 20  # llama.cpp's logger loses the tail at exit in up to 7 of 12 runs of a small model


def complete(path: str) -> bool:
    """The output reaches the `sum =` line of the last evaluation's logits (result_output)."""
    with open(path, "rb") as f:
        text = f.read()
    last = text.rfind(b"result_output = (")  # and no node after it: with -ub, the last evaluation's
    return last >= 0 and b"_debug" not in text[last:].split(b"\n", 1)[-1] and b"sum = " in text[last:]


def run_case(binary: str, model: str, prompt: str, flags: tuple[str, ...], dst: str) -> bool:
    args = [binary, "-m", model, "-p", prompt, "-t", "2", "--seed", "1", *flags, *flash_attn_off_args(binary)]
    best = -1
    for _ in range(ATTEMPTS):
        with open(dst + ".tmp", "wb") as out:
            code = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
        size = os.path.getsize(dst + ".tmp")
        if code == 0 and size > best:
            best = size
            os.replace(dst + ".tmp", dst)
        if code == 0 and complete(dst):
            return True
    if os.path.exists(dst + ".tmp"):
        os.remove(dst + ".tmp")
    return best >= 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    ap.add_argument("outdir")
    ap.add_argument("--old", required=True, help="the older llama-eval-callback")
    ap.add_argument("--new", required=True, help="the newer llama-eval-callback")
    ap.add_argument("--set", choices=sorted(SETS), required=True)
    ap.add_argument("--case", action="append", help="only these cases (default: every case of the set)")
    ap.add_argument("models", nargs="+", metavar="NAME=MODEL.gguf")
    a = ap.parse_args()
    for spec in a.models:
        name, _, model = spec.partition("=")
        folder = os.path.join(a.outdir, a.set, name)
        os.makedirs(folder, exist_ok=True)
        for case, prompt, flags in SETS[a.set]:
            if a.case and case not in a.case:
                continue
            for side, binary in (("old", a.old), ("new", a.new)):
                dst = os.path.join(folder, f"{case}.{side}.txt")
                ok = run_case(binary, model, prompt, flags, dst)
                print(f"{dst}\t{'ok' if ok else 'FAILED'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
