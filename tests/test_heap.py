"""model/heap.py: under the console script, `--model`'s threads share one glibc arena (and no trim is needed after each
layer); glibc's malloc_stats, in a child process, counts the arenas its threads allocated from."""
from __future__ import annotations

import subprocess
import sys

import pytest

from attncheck.model import heap

pytestmark = pytest.mark.skipif(heap._MALLOPT is None, reason="glibc's mallopt and malloc_stats only")

THREADS = """
import ctypes, sys
from concurrent.futures import ThreadPoolExecutor
import numpy as np
from attncheck.model import heap
if sys.argv[1] == "one":
    heap.one_arena()
def work(_):
    return float(np.ones((512, 512)).sum())  # 2 MB arrays, from each thread's arena
with ThreadPoolExecutor(3) as pool:
    list(pool.map(work, range(30)))
ctypes.CDLL(None).malloc_stats()  # an "Arena N:" paragraph per arena, on stderr
"""


def arenas(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", THREADS, mode], capture_output=True, text=True, check=True)
    return done.stderr.count("Arena ")


def test_one_arena_holds_every_threads_arrays():
    assert arenas("default") > 1  # glibc's default: what one_arena changes
    assert arenas("one") == 1


def test_no_trim_after_a_layer_once_threads_share_one_arena(monkeypatch):
    trims = []
    monkeypatch.setattr(heap, "_TRIM", lambda pad: trims.append(pad))
    monkeypatch.setattr(heap, "_one_arena", False)
    heap.give_back()
    assert trims == [0]
    monkeypatch.setattr(heap, "_one_arena", True)
    heap.give_back()
    assert trims == [0]
