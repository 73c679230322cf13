#!/usr/bin/env python3
"""attncheck's power on llama.cpp's own bugs: each patch of tests/llama_mutants/ injects one realistic bug into the
llama.cpp that scripts/build_llama.sh built, and attncheck is run on the dumps it makes, in four modes.

    python3 scripts/llama_mutants.py [--bugs NAME,...] [--repo DIR] [--out FILE] [--list]

For each patch (scripts/llama_rebuild.py: only the objects it touches recompiled) and each dump its header names
(DUMPS below: a model, a prompt, flags), the mutant's dump and the control's (the objects of every patch
recompiled without any) are made once and cached (scripts/llama_dumps.py), then attncheck runs

    check MUT            check MUT --model GGUF
    diff CLEAN MUT       diff CLEAN MUT --model GGUF

The control itself is run the same way on every dump: `check` and `check --model` on its dump, `diff` and
`diff --model` of the build's own binary (scripts/build_llama.sh) against it, two correct builds. attncheck is
the one in --repo (default: the current folder when it holds attncheck/, else this repository), run as
`python3 -m attncheck` with that folder on PYTHONPATH, and is always run again; builds and dumps are not.

Writes one JSON line per (bug, dump, mode) to --out (default build/llama-mutants.jsonl) and prints the table: per
bug and dump, how far the bug moved the printed logits (largest change over the rms of the control's printed
logits) and whether any printed number differs, then each mode's verdict: CAUGHT (exit 1), missed (exit 0; "(0
checked)" when the PASS counts no checked element), n/a (exit 3, nothing checkable: dump-only on a flash-attention
dump) or error (exit 2). Control rows say pass or FALSE ALARM. `--show FILE` prints the table of a results file
(`--markdown` as docs/power.md has it). Exit 0 unless a control raised a false alarm; 2 when something could not be
built or run.

Patch files: a header of `key: value` lines (bug, class, what, where, needs, dumps; a line starting with spaces
continues the one before), then a unified diff against the llama.cpp sources with a/ and b/ prefixes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import fetch_models  # noqa: E402
import llama_dumps  # noqa: E402
import llama_rebuild  # noqa: E402

PATCHES = ROOT / "tests" / "llama_mutants"
MODES = ("check", "check --model", "diff", "diff --model")

# Prompts. SHORT: 12 tokens for SmolLM2 (3 ubatches of 4); WORDS7: 7 tokens of make_arch_models.py's vocabulary,
# for a window of 4 (queries 4..6 reach back to slots 0..2, which llama.cpp prints); WORDS13: 13 tokens.
SHORT = "The quick brown fox jumps over the lazy dog because it was"
WORDS7 = "The cat sat on the mat."
WORDS13 = "The animal didn't cross the street because it was too tired."
# LONG: 542 tokens for gemma-3-270m, longer than its window of 512 (two ubatches of the default -ub 512)
LONG = " ".join([
    "The river that runs past the old mill has changed its course three times in the last two hundred years.",
    "Each time the water found a new path, the people of the valley had to move their fields, their roads and",
    "sometimes their houses. The first change came after a winter of heavy snow, when the spring flood carried",
    "away the stone bridge that had stood since the town was founded. The second came slowly, over decades, as",
    "the bank on the northern side wore away and the meadows there turned into marsh. The third was the work of",
    "engineers, who cut a straight channel through the fields to protect the new railway line from flooding.",
    "Today the old bed of the river is a long, narrow lake where herons fish in the early morning and children",
    "skate in winter when the ice is thick enough. The mill itself stopped working a century ago; its wheel",
    "rotted and was taken down, but the building was saved by a group of volunteers who turned it into a small",
    "museum. Inside, visitors can see the millstones, the wooden gears and the sacks in which flour was carried",
    "to the market on Saturdays. A map on the wall shows the three courses of the river in different colours,",
    "and an old photograph shows the miller and his family standing in front of the door, dressed in their best",
    "clothes, on the day the railway opened. Most visitors come in summer, when the gardens around the mill are",
    "in flower and the café serves cakes made from flour ground on a small electric mill in the back room. In",
    "autumn, schools bring their pupils to learn how bread was made before factories, and the volunteers show",
    "them how to sift the flour, knead the dough and bake it in the brick oven that still stands in the yard.",
    "The children are always surprised by how long it takes, and by how good the bread tastes when it is still",
    "warm. Some of them come back years later with their own children, and tell them about the day they baked",
    "their first loaf. The volunteers keep a book in which visitors can write what they remember, and some of",
    "the oldest entries are from people who knew the mill when it was still working. One of them describes the",
    "sound of the wheel at night, a steady knocking that could be heard from every house in the village, and",
    "how strange the silence felt when it finally stopped. Another remembers the flood of the last great winter,",
    "when the water rose so high that it came in through the door and covered the floor with mud. The miller",
    "and his sons worked for three days to clean the stones and dry the sacks, and the mill was grinding again",
    "before the end of the week. Such stories are the real treasure of the museum, more than its machines.",
])


@dataclass(frozen=True)
class DumpSpec:
    """A model (fetch_models.py's name, or arch/NAME: scripts/make_arch_models.py's), a prompt and the flags."""
    model: str
    prompt: str
    flags: tuple[str, ...]
    about: str


DUMPS: dict[str, DumpSpec] = {
    "smollm2": DumpSpec("smollm2", SHORT, ("--flash-attn", "off"), "SmolLM2-135M Q4_1, 12 tokens"),
    "smollm2-fa": DumpSpec("smollm2", SHORT, ("--flash-attn", "on"), "SmolLM2-135M Q4_1, 12 tokens, flash attention"),
    "smollm2-ub4": DumpSpec("smollm2", SHORT, ("-ub", "4", "--flash-attn", "off"),
                            "SmolLM2-135M Q4_1, 12 tokens in 3 ubatches"),
    "llama": DumpSpec("arch/llama", WORDS13, ("--flash-attn", "off"), "random llama, GQA 4/2, 13 tokens"),
    "gemma3": DumpSpec("arch/gemma3", WORDS7, ("--flash-attn", "off"), "random gemma3, window 4, 7 tokens"),
    "gemma2": DumpSpec("arch/gemma2", WORDS7, ("--flash-attn", "off"), "random gemma2, soft-cap 10, 7 tokens"),
    "bloom": DumpSpec("arch/bloom", WORDS7, ("--flash-attn", "off"), "random BLOOM, ALiBi, 6 heads, 7 tokens"),
    "gpt-oss": DumpSpec("arch/gpt-oss", WORDS7, ("--flash-attn", "off"), "random gpt-oss, sinks, 7 tokens"),
    "gemma3-270m": DumpSpec("gemma3-270m", SHORT, ("--flash-attn", "off"), "gemma-3-270m Q4_K_M, short prompt"),
    "gemma3-270m-long": DumpSpec("gemma3-270m", LONG, ("--flash-attn", "off"),
                                 "gemma-3-270m Q4_K_M, 542 tokens (window 512)"),
    "gemma3-270m-long-1ub": DumpSpec("gemma3-270m", LONG, ("-c", "2048", "-b", "2048", "-ub", "2048",
                                                           "--flash-attn", "off"),
                                     "gemma-3-270m Q4_K_M, 542 tokens in one ubatch (window 512): the extra keys "
                                     "are not among the printed slots"),
}


@dataclass
class Bug:
    """One patch file of tests/llama_mutants/."""
    path: Path
    header: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.header.get("bug", self.path.stem)

    @property
    def dumps(self) -> list[str]:
        return self.header.get("dumps", "").split()

    @classmethod
    def read(cls, path: Path) -> "Bug":
        header: dict[str, str] = {}
        last = None
        for line in path.read_text().splitlines():
            if line.startswith(("--- ", "diff ")):
                break
            if line.startswith(" ") and last:
                header[last] += " " + line.strip()
            elif ":" in line:
                last, value = (s.strip() for s in line.split(":", 1))
                header[last] = value
        bug = cls(path, header)
        unknown = [d for d in bug.dumps if d not in DUMPS]
        if not bug.dumps or unknown:
            raise SystemExit(f"llama_mutants: {path}: 'dumps:' names {unknown or 'nothing'}; known: {', '.join(DUMPS)}")
        return bug


def bugs(names: list[str] | None = None, folder: Path = PATCHES) -> list[Bug]:
    found = [Bug.read(p) for p in sorted(folder.glob("*.patch"))]
    if names:
        missing = set(names) - {b.name for b in found}
        if missing:
            raise SystemExit(f"llama_mutants: no patch for {', '.join(sorted(missing))} in {folder}")
        found = [b for b in found if b.name in names]
    return found


class Harness:
    """Binaries, models and dumps of one run, and attncheck's verdicts on them."""

    def __init__(self, repo: Path, build: llama_rebuild.Build | None = None, log=print):
        self.repo = repo
        self.build = build or llama_rebuild.Build()
        self.models_dir = self.build.work / "models"
        self.dumps_dir = self.build.work / "dumps"
        self.log = log
        self._models: dict[str, Path] = {}

    def model(self, key: str) -> Path:
        """The GGUF of a DumpSpec's model: fetched (fetch_models.py) or made (make_arch_models.py) once."""
        if key not in self._models:
            if key.startswith("arch/"):
                name = key[5:]
                out = self.models_dir / "arch"
                if not (out / f"{name}.gguf").exists():
                    done = subprocess.run([sys.executable, str(HERE / "make_arch_models.py"), str(out), name],
                                          capture_output=True, text=True)
                    if done.returncode != 0:
                        raise RuntimeError(f"make_arch_models.py {name}: {done.stderr[-800:]}")
                self._models[key] = out / f"{name}.gguf"
            else:
                self._models[key] = fetch_models.fetch(key)
        return self._models[key]

    def dump(self, binary: Path, spec_name: str, label: str) -> llama_dumps.Dump:
        """The binary's dump of DUMPS[spec_name], from the cache when made before; a cut one is said so."""
        spec = DUMPS[spec_name]
        made = llama_dumps.make_dump(binary, self.model(spec.model), spec.prompt, list(spec.flags),
                                     self.dumps_dir, f"{spec_name}-{label}")
        if not made.complete:
            self.log(f"warning: {made.path.name}: no complete run in {made.attempts} (the logger lost the tail); "
                     f"the longest kept")
        return made

    def attncheck(self, mode: str, a: Path, b: Path | None, model: Path) -> dict:
        """One attncheck run: exit code, its verdict line, seconds."""
        args = ["check", str(b or a)] if mode.startswith("check") else ["diff", str(a), str(b)]
        if mode.endswith("--model"):
            args += ["--model", str(model)]
        env = dict(os.environ, PYTHONPATH=str(self.repo) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        t0 = time.time()
        done = subprocess.run([sys.executable, "-m", "attncheck", *args, "-q"], capture_output=True, text=True,
                              env=env, timeout=3600)
        lines = [line for line in (done.stdout.strip().splitlines() or done.stderr.strip().splitlines())
                 if line.strip()]
        verdict = next((line for line in reversed(lines)
                        if line.startswith(("PASS", "FAIL", "DRIFT", "REGRESSION", "UNVERIFIED", "attncheck: error"))),
                       lines[-1] if lines else "")
        if "Traceback" in done.stderr:
            verdict = "traceback: " + done.stderr.strip().splitlines()[-1]
        return {"exit": done.returncode, "verdict": verdict[:400], "seconds": round(time.time() - t0, 2)}


def rows_for(h: Harness, bug: Bug | None, dump_name: str, clean_bin: Path, mut_bin: Path,
             modes: tuple[str, ...] = MODES) -> list[dict]:
    """The modes on one (bug, dump); bug None: the control, with the build's own binary (mut_bin) as OLD of diff."""
    spec = DUMPS[dump_name]
    model = h.model(spec.model)
    clean = h.dump(clean_bin, dump_name, "control")
    mut = h.dump(mut_bin, dump_name, "base" if bug is None else bug.name)
    old, new = (mut, clean) if bug is None else (clean, mut)   # control: diff BASE CONTROL
    eff = llama_dumps.effect(old.path, new.path)
    out = []
    for mode in modes:
        r = h.attncheck(mode, old.path, new.path, model)
        out.append({
            "bug": "control" if bug is None else bug.name,
            "class": "control: the patched objects rebuilt without a patch" if bug is None else bug.header["class"],
            "dump": dump_name, "dump_about": spec.about, "model": model.name, "flags": list(spec.flags),
            "tokens": new.tokens, "mode": mode, **r,
            "caught": r["exit"] == 1, "nothing_checked": nothing_checked(r),
            "logits_rel": eff.logits_rel, "printed_differs": eff.printed_differs, "first_node": eff.first_node,
            "dumps": [str(old.path), str(new.path)], "complete": old.complete and new.complete,
        })
    return out


def nothing_checked(r: dict) -> bool:
    """A PASS whose verdict counts no checked element (a run of which nothing was checked)."""
    return (r["exit"] == 0 and "0 softmax rows, 0 weight ratios, 0 masked weights, 0 kqv elements" in r["verdict"]
            and "with the model" not in r["verdict"])


def cell(r: dict, control: bool) -> str:
    if control:
        text = {0: "pass", 3: "n/a", 1: "FALSE ALARM"}.get(r["exit"], "error")
    else:
        text = {1: "CAUGHT", 0: "missed", 3: "n/a"}.get(r["exit"], "error")
    return text + (" (0 checked)" if r.get("nothing_checked") or (r["exit"] == 0 and nothing_checked(r)) else "")


def fmt_rel(x: float | None) -> str:
    if x is None:
        return "?"
    if math.isinf(x):
        return "nan/inf"
    return "0" if x == 0 else f"{x:.1e}"


def table(rows: list[dict], markdown: bool = False) -> str:
    """Bug × dump rows, the four modes as columns, then the counts per mode (markdown: as docs/power.md shows it)."""
    keyed: dict[tuple[str, str], dict[str, dict]] = {}
    for r in rows:
        keyed.setdefault((r["bug"], r["dump"]), {})[r["mode"]] = r
    head = ["bug", "class", "dump", "Δlogits/rms", "printed Δ", *MODES]
    body = []
    for (bug, dump), by_mode in keyed.items():
        any_r = next(iter(by_mode.values()))
        control = bug == "control"
        body.append([bug, "control" if control else any_r["class"], dump, fmt_rel(any_r["logits_rel"]),
                     "yes" if any_r["printed_differs"] else "no",
                     *[cell(by_mode[m], control) if m in by_mode else "" for m in MODES]])
    if markdown:
        head = [f"`{h}`" if h in MODES else h for h in head]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(str(x) for x in row) + " |" for row in body]
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(str(x).ljust(w) for x, w in zip(head, widths)).rstrip(),
                 "  ".join("-" * w for w in widths)]
        lines += ["  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip() for row in body]
    lines.append("")
    visible = {k for k, v in keyed.items() if k[0] != "control" and next(iter(v.values()))["printed_differs"]}
    for m in MODES:
        caught = sum(1 for k in visible if keyed[k].get(m, {}).get("caught"))
        alarms = sum(1 for k, v in keyed.items() if k[0] == "control" and v.get(m, {}).get("exit") == 1)
        controls = sum(1 for k, v in keyed.items() if k[0] == "control" and m in v)
        lines.append(f"{m:15s} caught {caught} of {len(visible)} bug × dump pairs that change a printed number; "
                     f"false alarms {alarms} of {controls} controls")
    return "\n".join(lines)


def default_repo() -> Path:
    cwd = Path.cwd()
    return cwd if (cwd / "attncheck" / "__init__.py").exists() else ROOT


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bugs", help="comma-separated bug names (default: every patch)")
    ap.add_argument("--repo", type=Path, default=None, help="the checkout whose attncheck is tested")
    ap.add_argument("--out", type=Path, default=None, help="JSON lines (default: build/llama-mutants.jsonl)")
    ap.add_argument("--no-control", action="store_true", help="leave out the control rows")
    ap.add_argument("--list", action="store_true", help="list the bugs and dumps, build and run nothing")
    ap.add_argument("--show", type=Path, metavar="JSONL", help="print the table of a results file, run nothing")
    ap.add_argument("--markdown", action="store_true", help="with --show: the table in markdown")
    args = ap.parse_args(argv)
    if args.show:
        print(table([json.loads(line) for line in args.show.read_text().splitlines() if line.strip()],
                    markdown=args.markdown))
        return 0
    chosen = bugs(args.bugs.split(",") if args.bugs else None)
    if args.list:
        for b in chosen:
            print(f"{b.name:22s} {b.header.get('class', ''):24s} {' '.join(b.dumps)}")
        for name, spec in DUMPS.items():
            print(f"dump {name:18s} {spec.about}; {' '.join(spec.flags)}")
        return 0
    repo = (args.repo or default_repo()).resolve()
    out = args.out or Path.cwd() / "build" / "llama-mutants.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    log = lambda msg: print(f"[llama_mutants +{time.time() - t0:.0f}s] {msg}", file=sys.stderr, flush=True)  # noqa
    t0 = time.time()
    h = Harness(repo, log=log)
    try:
        h.build.check()
        # the control recompiles the objects of every patch, so that any --bugs subset shares one control binary
        patches = [b.path.read_bytes() for b in bugs()]
        clean_bin = h.build.binary(patches[0], clean=True, also=patches[1:])
        rows: list[dict] = []
        with open(out, "w") as f:
            def emit(new_rows: list[dict]) -> None:
                rows.extend(new_rows)
                for r in new_rows:
                    f.write(json.dumps(r) + "\n")
                f.flush()

            if not args.no_control:
                for dump_name in dict.fromkeys(d for b in chosen for d in b.dumps):
                    log(f"control on {dump_name}")
                    emit(rows_for(h, None, dump_name, clean_bin, h.build.base_binary()))
            for b in chosen:
                mut_bin = h.build.binary(b.path.read_bytes())
                for dump_name in b.dumps:
                    log(f"{b.name} on {dump_name}")
                    emit(rows_for(h, b, dump_name, clean_bin, mut_bin))
    except (llama_rebuild.RebuildError, RuntimeError, OSError, subprocess.SubprocessError) as e:
        print(f"llama_mutants: error: {e}", file=sys.stderr)
        return 2
    print(table(rows))
    print(f"\n{len(rows)} runs of attncheck ({repo}) in {time.time() - t0:.0f} s; JSON lines in {out}")
    alarms = [r for r in rows if r["bug"] == "control" and r["exit"] not in (0, 3)]
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
