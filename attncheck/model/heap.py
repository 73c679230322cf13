"""glibc's heap under `--model`'s threads (reference.forward_layers, layer0._concurrently): one arena for all of them,
or, where a library caller's process has several, the heap a checked layer freed handed back after each layer."""
from __future__ import annotations

import ctypes

M_ARENA_MAX = -8  # mallopt's parameter (malloc.h)


def _libc():
    """The C library's malloc_trim and mallopt, or (None, None) (not glibc)."""
    try:
        libc = ctypes.CDLL(None)
        return libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):
        return None, None


_TRIM, _MALLOPT = _libc()
_one_arena = False


def one_arena() -> None:
    """Every thread allocates from the main arena, as the console script asks before it starts any. By default glibc
    gives each thread an arena of its own, and an array one thread frees is reused only by that thread: on
    gemma-3-270m at 553 tokens the peak was 518-520 MB with a trim after each layer, 417-421 MB with one arena and
    none, and the check 5-10% faster (the trim's pages were faulted in again by the next layer)."""
    global _one_arena
    if _MALLOPT is not None and _MALLOPT(M_ARENA_MAX, 1) == 1:
        _one_arena = True


def give_back() -> None:
    """Hand the heap a checked layer freed back to the system, where threads have arenas of their own (a library
    caller's process): its arrays are freed in the middle of three threads' heaps, which glibc keeps for their own
    reuse otherwise (on gemma-3-270m at 545 tokens, 583-586 MB at the peak without this, 500-502 MB with it)."""
    if _TRIM is not None and not _one_arena:
        _TRIM(0)
