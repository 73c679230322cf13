#!/usr/bin/env python3
"""Measure what `--model`'s cascade allowance needs (attncheck/model/bounds.py: TAU, NMSE_CASCADE) on real runs.

    python scripts/calibrate.py OUTDIR SET [MODEL ...]      # SET: calibrate | confirm | confirm4

Runs llama-eval-callback ($LLAMA_EVAL_CALLBACK, else the cache folder's) on each model of the set with its prompts and
flags, keeps each dump in OUTDIR/SET/ (an existing dump is reused), checks it with `attncheck check --model --json`,
and prints per run the exit code, the TAU the worst cascade node needed (overall and for the deepest third of the
layers), the largest cascade NMSE, and the first layer-0 node beyond print precision; a JSON line per run goes to
OUTDIR/SET.jsonl. The sets share no prompt: bounds are chosen on `calibrate` and must hold on `confirm` (and, for the
4- and 5-bit caches whose bounds `confirm` made us measure again, on `confirm4`).

Models: real pretrained files in ~/.cache/attncheck/models/real/ (SmolLM2 Q4_1, gemma-3-270m Q4_K_M, qwen2.5-coder
Q4_K_M), scripts/make_arch_models.py's (~/.cache/attncheck/arch-models/) and scripts/make_quant_models.py's
(~/.cache/attncheck/quant-models/) random ones.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("ATTNCHECK_CACHE", Path.home() / ".cache" / "attncheck"))
BIN = os.environ.get("LLAMA_EVAL_CALLBACK") or str(CACHE / "llama-0.3.36" / "bin" / "llama-eval-callback")
REAL = CACHE / "models" / "real"

# prompts: natural text for the real models, the random models' vocabulary (make_arch_models.WORDS) for the others
TEXT = {
    "calibrate": [
        ("how-are", "How are", ()),
        ("cat", "The cat sat on the mat because it was tired.", ()),
        ("harbour-ub7", "The history of the old harbour town began in the twelfth century, when a small group of "
                        "fishermen settled on the banks of the wide river. Over the following centuries it grew into "
                        "a busy port that traded wool, salt and timber with merchants from many distant lands.",
         ("-ub", "7")),
        ("cat-fa", "The cat sat on the mat because it was tired.", ("--flash-attn", "on")),
        ("cat-q8k", "The cat sat on the mat because it was tired.", ("-ctk", "q8_0")),
        ("cat-q4kv", "The cat sat on the mat because it was tired.", ("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on")),
        ("cat-q51kv", "The cat sat on the mat because it was tired.", ("-ctk", "q5_1", "-ctv", "q5_1", "-fa", "on")),
    ],
    "confirm": [
        ("village", "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.", ()),
        ("code", "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)",
         ()),
        ("paris-fa", "Paris is the capital of France, and Berlin is the capital of", ("--flash-attn", "on")),
        ("science-ub9", "Photosynthesis is the process by which green plants and some other organisms use sunlight "
                        "to synthesize foods from carbon dioxide and water. It generally involves the green pigment "
                        "chlorophyll and generates oxygen as a by-product, which most animals need to breathe.",
         ("-ub", "9")),
        ("village-q4", "Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.",
         ("-ctk", "q4_0", "-ctv", "q4_0", "--flash-attn", "on")),
        ("paris-f32", "Paris is the capital of France, and Berlin is the capital of", ("-ctk", "f32", "-ctv", "f32")),
        ("code-iq4kv", "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
                       "fibonacci(n - 2)", ("-ctk", "iq4_nl", "-ctv", "q5_0", "-fa", "on")),
    ],
    "confirm4": [  # 4- and 5-bit caches, after `confirm` showed gemma3 needs more there: prompts neither set saw
        ("mountains-q41", "Mountains rise above the quiet valley where farmers grow apples and pears every autumn.",
         ("-ctk", "q4_1", "-ctv", "q4_1", "-fa", "on")),
        ("orbit-iq4", "The spacecraft entered orbit around the red planet after a journey of seven months.",
         ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on")),
        ("letters-q50", "She opened the old wooden box and found letters written by her grandmother long ago.",
         ("-ctk", "q5_0", "-ctv", "q5_0", "-fa", "on")),
        ("mountains-k51", "Mountains rise above the quiet valley where farmers grow apples and pears every autumn.",
         ("-ctk", "q5_1")),
    ],
}
WORDS = {
    "calibrate": [
        ("how-are", "How are", ()),
        ("animal", "The animal didn't cross the street because it was too tired.", ()),
        ("draw-ub2", "I like to draw the cat", ("-ub", "2")),
        ("animal-fa", "The animal didn't cross the street because it was too tired.", ("--flash-attn", "on")),
    ],
    "confirm": [
        ("bank", "Hello my name is the bank, and we verify every number in the attention head.", ()),
        ("river-ub3", "The cat sat on the mat because the river was too tired, and I like money.", ("-ub", "3")),
        ("bank-fa", "Hello my name is the bank, and we verify every number in the attention head.",
         ("--flash-attn", "on")),
        ("cat-q8", "I like to draw the cat on the mat.", ("-ctk", "q8_0", "-ctv", "q8_0", "--flash-attn", "on")),
    ],
}


def smollm2_f16() -> Path:
    """SmolLM2's weights as F16 (llama-quantize --allow-requantize): real weights whose activations stay float."""
    out = CACHE / "calib" / "smollm2-f16.gguf"
    if not out.exists():
        quantize = Path(BIN).parent / "llama-quantize"
        subprocess.run([str(quantize), "--allow-requantize", str(REAL / "SmolLM2-135M-Instruct.Q4_1.gguf"), str(out),
                        "F16"], check=True, capture_output=True)
    return out


def models() -> dict[str, tuple[Path, str]]:
    """name → (GGUF path, prompt kind)."""
    out = {"smollm2": (REAL / "SmolLM2-135M-Instruct.Q4_1.gguf", "text"), "smollm2-f16": (smollm2_f16(), "text"),
           "gemma3-270m": (REAL / "gemma-3-270m-q4_k_m.gguf", "text"),
           "qwen2.5-0.5b": (REAL / "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf", "text")}
    for folder in ("arch-models", "quant-models"):
        for p in sorted((CACHE / folder).glob("*.gguf")):
            if not p.stem.startswith("base"):
                out[f"{folder.split('-')[0]}/{p.stem}"] = (p, "words")
    return out


def run(out: Path, name: str, model: Path, prompt: str, flags: tuple[str, ...], tag: str) -> dict:
    dump = out / f"{name.replace('/', '-')}-{tag}.txt"
    if not dump.exists():
        with open(dump.with_suffix(".tmp"), "wb") as f:
            subprocess.run([BIN, "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1",
                            *(flags if "--flash-attn" in flags or "-fa" in flags else ("--flash-attn", "off", *flags))],
                           stdout=f, stderr=subprocess.STDOUT, check=False, timeout=900)
        dump.with_suffix(".tmp").rename(dump)
    done = subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--model", str(model), "--json", "-"],
                          capture_output=True, text=True, timeout=1800)
    row = {"model": name, "run": tag, "flags": " ".join(flags), "exit": done.returncode}
    try:
        m = json.loads(done.stdout)["model"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return {**row, "error": done.stderr.strip()[-300:]}
    c = m.get("cascade") or {}
    layers = c.get("by_layer", [])
    deep = [x for x in layers if x["layer"] >= 2 * (1 + max((y["layer"] for y in layers), default=0)) // 3]
    first = m.get("first_beyond_print") or {}
    return {**row, "tau": c.get("tau_needed"), "tau_deep": max((x["tau_needed"] for x in deep), default=None),
            "nmse": c.get("nmse"), "at": c.get("at"), "layer0_beyond": first.get("node") if first.get("layer") == 0
            else None, "failed": m.get("first_failed")}


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[2] not in TEXT:
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        return 2
    out, which = Path(argv[1]) / argv[2], argv[2]
    out.mkdir(parents=True, exist_ok=True)
    chosen = {k: v for k, v in models().items() if not argv[3:] or k in argv[3:]}
    with open(Path(argv[1]) / f"{which}.jsonl", "a") as log:
        for name, (path, kind) in chosen.items():
            only = [t for t in os.environ.get("CALIBRATE_ONLY", "").split(",") if t]
            for tag, prompt, flags in (TEXT if kind == "text" else WORDS).get(which, []):
                if only and tag not in only:
                    continue
                row = run(out, name, path, prompt, flags, tag)
                log.write(json.dumps(row) + "\n")
                log.flush()
                fmt = lambda x: "-" if x is None else f"{x:.3g}"  # noqa: E731
                print(f"{name:24s} {tag:12s} exit {row['exit']}  tau {fmt(row.get('tau'))}  deep "
                      f"{fmt(row.get('tau_deep'))}  nmse {fmt(row.get('nmse'))}  layer0 "
                      f"{row.get('layer0_beyond') or 'ok'}  {row.get('error', '')}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
