#!/usr/bin/env python3
"""Measure what `--model`'s deep-layer verdict allows (attncheck/model/bounds.py: CASCADE) on correct runs, fit it,
and confirm it on runs the fit never saw.

    python scripts/calibrate.py dumps OUTDIR SET [MODEL ...]     # llama-eval-callback runs, kept in OUTDIR/SET/
    python scripts/calibrate.py measure OUTDIR SET [MODEL ...]   # attncheck check --model on each: OUTDIR/SET.jsonl
    python scripts/calibrate.py fit OUTDIR SET [SET ...]         # the allowances, and leave-one-model-out
    python scripts/calibrate.py check OUTDIR SET [SET ...]       # false alarms of the bounds in bounds.py
    python scripts/calibrate.py confirm OUTDIR FIT[,FIT] SET [SET ...]  # fit on FIT, false alarms on the others

SETS: `wide` (calibration) and `wide-confirm` (confirmation: other prompts, ubatch sizes and cache types); the
earlier `calibrate`, `confirm` and `confirm4` sets are kept. Each run names its model, the llama.cpp build (`new`:
today's, `old`: August 2024's, whose log prints no token ids: they are taken from the `new` dump of the same prompt),
its prompt and flags. An existing dump is reused. `measure` records, per cascade node (every node past layer 0's
attention), its regime, class, depth and the normalised excess of each printed element (z = (|err| − print and f32
rounding) / allowance unit: bounds.py), and per layer-0 node its need; `fit` chooses the allowances from a set of
runs and prints, leaving each model out in turn, whether its runs pass the allowances fitted without it.

Models: real pretrained files in ~/.cache/attncheck/models/real/ (SmolLM2-135M Q4_1 and as F16, gemma-3-270m Q4_K_M,
and qwen2.5-coder-0.5b Q4_K_M when present), scripts/make_arch_models.py's (~/.cache/attncheck/arch-models/) and
scripts/make_quant_models.py's (~/.cache/attncheck/quant-models/) random ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("ATTNCHECK_CACHE", Path.home() / ".cache" / "attncheck"))
BINS = {"new": os.environ.get("LLAMA_EVAL_CALLBACK") or str(CACHE / "llama-0.3.36" / "bin" / "llama-eval-callback"),
        "old": str(CACHE / "llama-0.2.90" / "bin" / "llama-eval-callback")}
REAL = CACHE / "models" / "real"
ROOT = Path(__file__).resolve().parent.parent

_SENTENCES = [
    "The old lighthouse keeper climbed the spiral stairs every evening to light the great lamp.",
    "Ships passing in the night relied on its steady beam to find the narrow channel between the rocks.",
    "In winter the storms grew fierce, and waves crashed against the cliffs with a sound like thunder.",
    "His daughter learned to read the weather from the colour of the sky and the shape of the clouds.",
    "Years later she wrote a book about the coast, its birds, its tides and the people who lived there.",
    "Scientists measure the temperature of the ocean with floating instruments that drift for many years.",
    "A committee of engineers reviewed the design of the new bridge before construction could begin.",
    "Farmers in the valley grow wheat, barley and potatoes, and they sell their produce at the weekly market.",
    "The museum opened a new exhibition of paintings from the seventeenth century, borrowed from collections abroad.",
    "Mathematics describes patterns, and a proof shows that a statement holds in every possible case.",
]


def paragraph(n_sentences: int, start: int = 0) -> str:
    """Natural text of about 19 tokens per sentence, the sentences taken in turn (long prompts repeat them)."""
    return " ".join(_SENTENCES[(start + i) % len(_SENTENCES)] for i in range(n_sentences))


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
    "confirm4": [
        ("mountains-q41", "Mountains rise above the quiet valley where farmers grow apples and pears every autumn.",
         ("-ctk", "q4_1", "-ctv", "q4_1", "-fa", "on")),
        ("orbit-iq4", "The spacecraft entered orbit around the red planet after a journey of seven months.",
         ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on")),
        ("letters-q50", "She opened the old wooden box and found letters written by her grandmother long ago.",
         ("-ctk", "q5_0", "-ctv", "q5_0", "-fa", "on")),
        ("mountains-k51", "Mountains rise above the quiet valley where farmers grow apples and pears every autumn.",
         ("-ctk", "q5_1")),
    ],
    # every KV cache type, prompts of 1 to ~600 tokens, -ub 1 to 512; the 2024 build where it runs the model
    "wide": [
        ("one", "Hello", (), ("new", "old")),
        ("s11-f32", paragraph(1), ("-ctk", "f32", "-ctv", "f32"), ("new",)),
        ("s11-bf16", paragraph(1), ("-ctk", "bf16", "-ctv", "bf16"), ("new",)),
        ("s11-k8", paragraph(1), ("-ctk", "q8_0"), ("new", "old")),
        ("s11-ub1", paragraph(1, 1)[:40], ("-ub", "1"), ("new",)),
        ("s50-ub7", paragraph(3, 2), ("-ub", "7"), ("new", "old")),
        ("s50-fa", paragraph(3, 2), ("-fa", "on"), ("new", "old")),
        ("s50-q40", paragraph(3, 2), ("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on"), ("new",)),
        ("s50-q41", paragraph(3, 3), ("-ctk", "q4_1", "-ctv", "q4_1", "-fa", "on"), ("new",)),
        ("s50-q50", paragraph(3, 4), ("-ctk", "q5_0", "-ctv", "q5_0", "-fa", "on"), ("new",)),
        ("s50-q51", paragraph(3, 5), ("-ctk", "q5_1", "-ctv", "q5_1", "-fa", "on"), ("new",)),
        ("s50-q80", paragraph(3, 6), ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"), ("new",)),
        ("s150-ub32", paragraph(8, 1), ("-ub", "32"), ("new",)),
        ("s600", paragraph(31), ("-c", "2048", "-b", "2048", "-ub", "512"), ("new",)),
    ],
    "wide-confirm": [
        ("two", "Good morning", ("-ctk", "f32", "-ctv", "f32"), ("new",)),
        ("s20-ub3", paragraph(1, 7) + " " + paragraph(1, 8)[:30], ("-ub", "3"), ("new", "old")),
        ("s30-bf16", paragraph(2, 8), ("-ctk", "bf16", "-ctv", "bf16"), ("new",)),
        ("s30-k8-ub5", paragraph(2, 9), ("-ctk", "q8_0", "-ub", "5"), ("new",)),
        ("s40-q40-ub4", paragraph(2, 1), ("-ctk", "q4_0", "-ctv", "q4_0", "-fa", "on", "-ub", "4"), ("new",)),
        ("s40-q51", paragraph(2, 2), ("-ctk", "q5_1", "-ctv", "q5_1", "-fa", "on"), ("new",)),
        ("s40-q80", paragraph(2, 3), ("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"), ("new",)),
        ("s100-fa", paragraph(5, 4), ("-fa", "on"), ("new", "old")),
        ("s300-ub64", paragraph(16, 5), ("-ub", "64", "-c", "2048"), ("new",)),
        ("s550", paragraph(30, 3), ("-c", "2048", "-b", "2048", "-ub", "2048"), ("new",)),
    ],
    # an IQ4_NL cache (its own class in bounds.KV_CLASS: each block's scale is chosen by a search, so f32 noise can
    # change a whole block): calibration and, on other prompts, flags and cache pairings, confirmation
    "iq4": [
        ("s50-iq4v", paragraph(3, 2), ("-ctk", "q5_0", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("s50-iq4kv", paragraph(3, 7), ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("s150-iq4v-ub32", paragraph(8, 3), ("-ctk", "q8_0", "-ctv", "iq4_nl", "-fa", "on", "-ub", "32"), ("new",)),
    ],
    "iq4-confirm": [
        ("s30-iq4v", paragraph(2, 5), ("-ctk", "f16", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("s80-iq4kv-ub7", paragraph(4, 1), ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on", "-ub", "7"), ("new",)),
        ("s40-iq4k", paragraph(2, 6), ("-ctk", "iq4_nl"), ("new",)),
    ],
}
_W = ["How", " are", " you", "I", " like", " to", " draw", "The", " cat", " sat", " on", " the", " mat", " animal",
      " didn", "'t", " cross", " street", " because", " it", " was", " too", " tired", ".", " Hello", " my", " name",
      " is", " bank", " river", " money", " attention", " head", " verify", " every", " number", ",", " and", " a",
      " of", " in", " we", "We"]  # make_arch_models.WORDS: one token each


def words(n: int, start: int = 0, step: int = 7) -> str:
    """n tokens of the random models' vocabulary, in an order that does not repeat quickly."""
    return "".join(_W[(start + i * step) % len(_W)] for i in range(n)).strip()


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
    "wide": [
        ("one", "Hello", (), ("new", "old")),
        ("w12-f32", words(12, 1), ("-ctk", "f32", "-ctv", "f32"), ("new",)),
        ("w12-k8", words(12, 2), ("-ctk", "q8_0"), ("new", "old")),
        ("w30-ub1", words(9, 3), ("-ub", "1"), ("new",)),
        ("w40-fa-q41", words(40, 4), ("-ctk", "q4_1", "-ctv", "q4_1", "-fa", "on"), ("new",)),
        ("w60-ub16", words(60, 5), ("-ub", "16"), ("new", "old")),
        ("w300", words(300, 6), (), ("new",)),
    ],
    "wide-confirm": [
        ("w8-bf16", words(8, 9, 5), ("-ctk", "bf16", "-ctv", "bf16"), ("new",)),
        ("w20-ub3", words(20, 10, 5), ("-ub", "3"), ("new", "old")),
        ("w30-fa-q50", words(30, 11, 5), ("-ctk", "q5_0", "-ctv", "q5_0", "-fa", "on"), ("new",)),
        ("w50-fa", words(50, 12, 5), ("-fa", "on"), ("new", "old")),
        ("w200-ub64", words(200, 13, 5), ("-ub", "64"), ("new",)),
    ],
    "iq4": [
        ("w13-iq4v", words(13, 1), ("-ctk", "q5_0", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("w40-iq4kv", words(40, 4), ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("w100-iq4v-ub16", words(100, 5), ("-ctk", "q8_0", "-ctv", "iq4_nl", "-fa", "on", "-ub", "16"), ("new",)),
    ],
    "iq4-confirm": [
        ("w20-iq4v", words(20, 10, 5), ("-ctk", "q4_0", "-ctv", "iq4_nl", "-fa", "on"), ("new",)),
        ("w60-iq4kv-ub5", words(60, 12, 5), ("-ctk", "iq4_nl", "-ctv", "iq4_nl", "-fa", "on", "-ub", "5"), ("new",)),
        ("w30-iq4k", words(30, 8, 5), ("-ctk", "iq4_nl"), ("new",)),
    ],
}
# what the 2024 build loads (scripts/README.md): these random models, SmolLM2; not gemma3, qwen3, granite, gpt2
OLD_LOADS = ("arch/llama", "arch/qwen2", "arch/phi3", "arch/falcon", "arch/starcoder2", "smollm2", "smollm2-f16")


def smollm2_f16() -> Path:
    """SmolLM2's weights as F16 (llama-quantize --allow-requantize): real weights whose activations stay float."""
    out = CACHE / "calib" / "smollm2-f16.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        quantize = Path(BINS["new"]).parent / "llama-quantize"
        subprocess.run([str(quantize), "--allow-requantize", str(REAL / "SmolLM2-135M-Instruct.Q4_1.gguf"), str(out),
                        "F16"], check=True, capture_output=True)
    return out


FORWARD = ("gpt2", "llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "starcoder2", "falcon")


def models() -> dict[str, tuple[Path, str]]:
    """name → (GGUF path, prompt kind): the real models present and the random ones with a reference forward."""
    out = {"smollm2": (REAL / "SmolLM2-135M-Instruct.Q4_1.gguf", "text"), "smollm2-f16": (smollm2_f16(), "text"),
           "gemma3-270m": (REAL / "gemma-3-270m-q4_k_m.gguf", "text"),
           "qwen2.5-0.5b": (REAL / "qwen2.5-coder-0.5b-instruct-awq.Q4_K_M.gguf", "text")}
    out = {k: v for k, v in out.items() if v[0].exists()}
    for p in sorted((CACHE / "arch-models").glob("*.gguf")):
        if p.stem in FORWARD:
            out[f"arch/{p.stem}"] = (p, "words")
    for p in sorted((CACHE / "quant-models").glob("*.gguf")):
        if not p.stem.startswith("base"):
            out[f"quant/{p.stem}"] = (p, "words")
    return out


def cases(which: str, name: str, kind: str) -> list[tuple[str, str, tuple[str, ...], str]]:
    """(tag, prompt, flags, build) of a model in a set."""
    out = []
    for entry in (TEXT if kind == "text" else WORDS).get(which, []):
        tag, prompt, flags, *builds = entry
        for build in (builds[0] if builds else ("new",)):
            if build == "old" and (name not in OLD_LOADS or not Path(BINS["old"]).exists()):
                continue
            out.append((tag if build == "new" else f"{tag}.old", prompt, tuple(flags), build))
    return out


def dump_path(out: Path, name: str, tag: str) -> Path:
    return out / f"{name.replace('/', '-')}-{tag}.txt"


def make_dump(out: Path, name: str, model: Path, prompt: str, flags: tuple[str, ...], tag: str, build: str) -> Path:
    dump = dump_path(out, name, tag)
    if dump.exists():
        return dump
    args = list(flags)
    if build == "old":  # -fa is a switch there, off by default
        args = [a for i, a in enumerate(args) if not (a == "on" and args[i - 1] in ("-fa", "--flash-attn"))]
        args = ["-fa" if a == "--flash-attn" else a for a in args]
    elif "--flash-attn" not in args and "-fa" not in args:
        args = ["--flash-attn", "off", *args]
    for _ in range(ATTEMPTS):  # llama.cpp's logger loses its tail at exit in about half the runs: the last layer's
        with open(dump.with_suffix(".tmp"), "wb") as f:  # nodes would be measured less often than the others
            subprocess.run(["nice", "-n", "10", BINS[build], "-m", str(model), "-p", prompt, "-t", "2", "--seed", "1",
                            *args], stdout=f, stderr=subprocess.STDOUT, check=False, timeout=1800)
        if whole(dump.with_suffix(".tmp")):
            break
    dump.with_suffix(".tmp").rename(dump)
    return dump


ATTEMPTS = 12


def whole(dump: Path) -> bool:
    """Whether a dump holds llama.cpp's whole graph: the last node printed is the logits, with its sum line."""
    text = dump.read_text(errors="replace")
    last = max(text.rfind("common_debug_cb_eval:"), text.rfind("ggml_debug:"))  # today's header, 2024's
    return last >= 0 and "result_output = " in text[last:last + 300] and "sum = " in text[last:]


def logged_tokens(dump: Path) -> str | None:
    """The token ids today's llama.cpp logged for a dump's run (for the 2024 build's dump of the same prompt)."""
    sys.path.insert(0, str(ROOT))
    import attncheck

    d = attncheck.read_dump(dump)
    for _ in d.evaluations():
        pass
    return ",".join(map(str, d.runs[0].tokens)) if d.runs and d.runs[0].tokens else None


def measure(dump: Path, model: Path, tokens: str | None) -> dict:
    """The --model checks of one dump (in this process: called in a fresh one per dump): the verdict, and per node
    what calibration reads — cascade nodes: [reference layer, class, check, printed values, largest z, median z];
    layer-0 (derived) nodes: [check, need, elements beyond print precision, printed elements]."""
    import resource
    import time

    sys.path.insert(0, str(ROOT))
    import attncheck
    from attncheck.model.bounds import regime
    from attncheck.model.checker import ModelChecker
    from attncheck.model.runs import parse_tokens

    start = time.monotonic()
    d = attncheck.read_dump(dump)
    mc = ModelChecker(str(model), d.source, tokens=parse_tokens(tokens))
    failed = []
    for ev in d.evaluations():
        for sr in mc.check(ev):
            failed += [f"eval {sr.evaluation} layer {sr.layer} {r.check} {r.node} (line {r.line}): need {r.ratio:.3g} "
                       f"{r.note}"[:300]
                       for r in sr.results if not r.passed]
    _, block = mc.finish()
    run0 = (block.get("runs") or [{}])[0]
    notes = mc.summary.notes
    return {"exit": 1 if failed else 0, "failed": failed[:5], "n_failed": len(failed),
            "nodes_printed": block["nodes_printed"], "nodes_checked": block["nodes_checked"],
            "regime": list(regime(mc.activations, run0.get("kv_type") or "f16", run0.get("v_type") or "f16")),
            "n_layer": mc.model.hparams.n_layer, "arch": mc.model.hparams.arch, "T": len(run0.get("tokens") or []),
            "cascade": [[n.ref_layer, n.cls, n.check, len(n.z), n.tau_needed, n.median] for n in notes
                        if n.tau_needed is not None],
            "chaos": [list(n.chaos or (0.0, 0.0)) for n in notes if n.tau_needed is not None],
            "derived": [[n.check, n.need, n.beyond_print, n.n] for n in notes if n.error_model.startswith("derived")],
            "power": [[n.layer, n.node, n.check, round(n.bound, 6), round(n.rms, 6)] for n in notes
                      if n.check in ("model_q", "model_kq", "model_kqv") and n.evaluation == notes[-1].evaluation],
            "seconds": round(time.monotonic() - start, 2),
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def run_measure(out: Path, which: str, chosen: dict) -> None:
    """Each case of the set not measured yet (OUTDIR/SET.jsonl; CALIBRATE_ONLY=tag,... restricts the cases)."""
    path_log = out.parent / f"{which}.jsonl"
    measured = set()
    if path_log.exists():
        measured = {(r["model"], r["run"]) for r in map(json.loads, path_log.read_text().splitlines()) if "cascade" in r}
    only = [t for t in os.environ.get("CALIBRATE_ONLY", "").split(",") if t]
    with open(path_log, "a") as log:
        for name, (path, kind) in chosen.items():
            for tag, prompt, flags, build in cases(which, name, kind):
                if (name, tag) in measured or (only and tag.removesuffix(".old") not in only):
                    continue
                dump = make_dump(out, name, path, prompt, flags, tag, build)
                tokens = None
                if build == "old":
                    tokens = logged_tokens(make_dump(out, name, path, prompt, tuple(flags), tag[:-4], "new"))
                done = subprocess.run(["nice", "-n", "10", sys.executable, __file__, "one", str(dump), str(path),
                                       tokens or ""], capture_output=True, text=True, timeout=3600)
                row = {"model": name, "run": tag, "flags": " ".join(flags), "build": build}
                try:
                    row.update(json.loads(done.stdout.strip().splitlines()[-1]))
                except (json.JSONDecodeError, IndexError):
                    row["error"] = done.stderr.strip()[-400:]
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(f"{name:22s} {tag:16s} exit {row.get('exit')}  nodes {row.get('nodes_checked')}/"
                      f"{row.get('nodes_printed')}  {row.get('error', '')[-200:]}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[1] == "one":  # internal: measure one dump, print one JSON line
        print(json.dumps(measure(Path(argv[2]), Path(argv[3]), argv[4] if len(argv) > 4 and argv[4] else None)))
        return 0
    if len(argv) < 4 or argv[1] not in ("dumps", "measure", "fit", "check", "confirm"):
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        return 2
    cmd, root = argv[1], Path(argv[2])
    if cmd in ("fit", "check", "confirm"):
        sys.path.insert(0, str(ROOT / "scripts"))
        from calibration_fit import main as fit_main

        return fit_main(cmd, root, argv[3:])
    which = argv[3]
    if which not in TEXT:
        print(f"calibrate: no set {which!r} (sets: {', '.join(TEXT)})", file=sys.stderr)
        return 2
    out = root / which
    out.mkdir(parents=True, exist_ok=True)
    chosen = {k: v for k, v in models().items() if not argv[4:] or k in argv[4:]}
    if cmd == "dumps":
        for name, (path, kind) in chosen.items():
            for tag, prompt, flags, build in cases(which, name, kind):
                make_dump(out, name, path, prompt, flags, tag, build)
                print(f"{name:22s} {tag}", flush=True)
        return 0
    run_measure(out, which, chosen)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
