#!/usr/bin/env python3
"""Run the same prompts through two llama.cpp builds and keep each pair of dumps: the material `attncheck diff`'s
drift model is measured on (scripts/drift_calibrate.py) and confirmed on.

    python3 scripts/drift_pairs.py OUTDIR --old OLD_BIN --new NEW_BIN --set calibration NAME=MODEL.gguf ...

Writes OUTDIR/<set>/<NAME>/<case>.old.txt and .new.txt, each the merged output (`2>&1`) of
`llama-eval-callback -m MODEL -p PROMPT -t 2 --seed 1` plus the case's flags, with flash attention off in the
syntax each binary takes (attncheck.cli.llama.flash_attn_off_args reads it from `--help`). A run whose output ends
before the last node (today's asynchronous logger loses its tail at exit) is made again, up to 5 times; the
longest output is kept.

The sets share no (model, prompt) case: calibration and confirmation measured the allowance (A, P, the factors),
holdout confirms it on prompts, lengths, -ub and cache types neither saw (`--case` picks cases: ESSAY is too long
for a random model's context).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from attncheck.cli.llama import flash_attn_off_args  # noqa: E402

CAT = "The cat sat on the mat because it was tired."
VERIFY = "We verify every number in the attention head, and we like it."
LONG = ("The history of the old harbour town began in the twelfth century, when a small group of fishermen settled "
        "on the banks of the wide river. Over the following centuries it grew into a busy port that traded wool, salt "
        "and timber with merchants from many distant lands.")
HELLO = "Hello my name is the river bank, and we like money."
BANK = "The bank of the river was too tired, and I like to verify every number in a head."
# the held-out set: prompts, lengths (2 to 300 tokens), -ub and cache types the two sets above never used. A
# random model (scripts/make_arch_models.py's byte-level vocabulary) reads a word it does not list byte by byte, so
# STORY is about 110 tokens there and LIBRARY about 300; SmolLM2's tokenizer makes them about 25 and 70, and ESSAY
# (too long for a random model's 512-token context) about 300.
TWO, FOUR, FIVE = "We verify", "We like the cat", "The river was too tired"
MID = "We like to verify every number in the attention head, and the cat sat on the mat because it was too tired."
STORY = ("A quiet library stood at the end of the lane; its keeper counted books by candlelight and wrote each title "
         "twice.")
LIBRARY = ("A quiet library stood at the end of the lane, and its keeper counted the books by candlelight every "
           "evening. He wrote each title twice, once in a ledger and once on a card, because he trusted neither alone. "
           "Travellers who passed through the valley stopped to read by his fire, and some of them left a book behind "
           "in payment for the warmth and the light.")
ESSAY = " ".join([LIBRARY, (
    "In spring the river rose and the lane flooded, so the keeper carried the oldest volumes to the attic one armful at "
    "a time. He counted them again as he stacked them under the roof, and again when the water fell and he carried "
    "them down. The numbers always agreed, and he was quietly proud of that. Children from the farms came on rainy "
    "afternoons to hear him read aloud; he chose stories of ships and mountains and distant cities, and he never "
    "finished one in a single day, so that they would return. Years later one of those children became a teacher in "
    "the town, and she sent her own pupils up the lane with a list of questions and a basket of bread. The keeper "
    "answered every question in writing, slowly and carefully, and the answers were kept in a box that still sits on "
    "a shelf near the door.")])
SETS = {  # case name, prompt, extra flags
    "calibration": [("how-are-you", "How are you", ()), ("cat", CAT, ()),
                    ("draw-ub2", "I like to draw the cat", ("-ub", "2")), ("verify", VERIFY, ()),
                    ("cat-ctk-f32", CAT, ("-ctk", "f32")), ("long-ub7", LONG, ("-ub", "7"))],
    "confirmation": [("hello", HELLO, ()), ("hello-ub3", HELLO, ("-ub", "3")), ("bank-ub5", BANK, ("-ub", "5"))],
    "holdout": [("two-ub1", TWO, ("-ub", "1")), ("four", FOUR, ()), ("five-ub1", FIVE, ("-ub", "1")),
                ("five-ctk-q8", FIVE, ("-ctk", "q8_0")), ("mid-ub7", MID, ("-ub", "7")),
                ("mid-ctk-f32", MID, ("-ctk", "f32")), ("story-ub32", STORY, ("-ub", "32")),
                ("library-ub32", LIBRARY, ("-ub", "32")), ("library-ub7", LIBRARY, ("-ub", "7")),
                ("essay-ub32", ESSAY, ("-ub", "32")), ("essay-ub7", ESSAY, ("-ub", "7"))],
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
