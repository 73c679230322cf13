"""Shared fixtures: the real llama.cpp dumps copied into fixtures/, and a runner for the attncheck command."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase, settings

# scripts/mutate.py: a mutant that fails a property fails it at once; shrinking the example would only take minutes
settings.register_profile("mutate", phases=[Phase.explicit, Phase.reuse, Phase.generate])

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# every shipped dump is a correct llama.cpp run; the flash-attention ones print no scores (exit 3)
DUMPS = {
    "gpt2-how-are.txt": 0,
    "gpt2-how-are-you.txt": 0,
    "gpt2-long.txt": 0,
    "gpt2-ubatch2.txt": 0,
    "gpt2-kv-f32.txt": 0,
    "gpt2-flash-attn.txt": 3,
    "gpt2-flash-f16-acc.txt": 3,
    "gpt2-kv-f32-flash.txt": 3,
    "llama-gqa-draw.txt": 0,
    "llama-gqa-long.txt": 0,
    "old-llama-gqa-how-are-you.txt": 0,
}


class Run:
    def __init__(self, proc: subprocess.CompletedProcess):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def json(self) -> dict:
        return json.loads(self.out)


def attncheck(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Run:
    """Run the real command line in a subprocess, as a user or CI would (a pipe: tables 120 columns wide unless
    env gives COLUMNS)."""
    environ = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "attncheck", *map(str, args)], input=stdin,
                          capture_output=True, timeout=120, env={**environ, **(env or {})})
    return Run(subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout.decode(), proc.stderr.decode()))


@pytest.fixture(scope="session")
def smollm2_dumps(tmp_path_factory) -> tuple[Path, Path]:
    """The real SmolLM2 Q4_1 pair of fixtures/drift/ ("How are", 30 layers; llama.cpp of August 2024, OLD, and
    today's, NEW), unpacked."""
    import lzma

    out = tmp_path_factory.mktemp("smollm2")
    paths = []
    for side in ("old", "new"):
        p = out / f"how-are.{side}.txt"
        p.write_bytes(lzma.decompress((FIXTURES / "drift" / f"smollm2-how-are.{side}.txt.xz").read_bytes()))
        paths.append(p)
    return paths[0], paths[1]


@pytest.fixture
def fixture_path():
    return lambda name: FIXTURES / name


def bert_gguf(tmp_path) -> Path:
    """A real GGUF file of an architecture attncheck's reference does not know (bert), with one tensor."""
    import gguf
    import numpy as np

    path = tmp_path / "bert.gguf"
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
