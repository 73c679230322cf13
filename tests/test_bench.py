"""`make bench` runs from a fresh clone: what it needs is in the repository, nothing from beside it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import attncheck

ROOT = Path(attncheck.__file__).resolve().parents[1]  # the checkout under test


def test_bench_runs_from_a_copy_of_the_repository_alone(tmp_path):
    clone = tmp_path / "clone"  # nothing beside it: no ../shared/
    shutil.copytree(ROOT, clone, ignore=shutil.ignore_patterns(".git", "build", ".pytest_cache", ".hypothesis",
                                                                "__pycache__", "*.egg-info", ".benchmarks"))
    proc = subprocess.run([sys.executable, "bench/bench.py", "--repeat", "1", "--copies", "1"], cwd=clone,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "gpt2-deep-48l.txt: 34.8 MB, 13 evaluations, 624 sites;" in proc.stdout
    assert "verdict pass" in proc.stdout
    assert "exit 0" in proc.stdout and "exit 1" not in proc.stdout
