"""Inputs for the HTML page's tests: a failing copy of a real dump, and the untrusted-text case.

The failing copy is gpt2-how-are.txt with one printed weight changed (head 0, query 1, slot 1: 0.0290 → 0.0310):
the softmax check fails there and the kqv elements it feeds fail too.

The untrusted-text case is hand-made on purpose: no llama.cpp run prints a node named like markup, and no shipped
model has such a token. The same failing copy gets its weights node renamed to NASTY (every header that names it),
and a copy of the shipped GPT-2 model gets NASTY as the text of token 257, the prompt's first token; the page must
show both as text and run nothing.
"""
from __future__ import annotations

from pathlib import Path

from dumpedit import DumpEdit

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"  # not conftest's: under tests/e2e that name is theirs

NASTY = "</script><img src=x onerror=alert(1)>\"'&<!--"
NASTY_NODE = NASTY + "-0"  # the layer number stays readable at the end of the name
GPT2 = FIXTURES / "models" / "gpt2-mini-q8_0.gguf"
HOW_ARE = FIXTURES / "gpt2-how-are.txt"
FAILING = (0, 1, 1)  # head, query, slot of the changed weight in layer 0


def failing_copy(dst: Path) -> Path:
    edit = DumpEdit(HOW_ARE, dst)
    edit.set("kq_soft_max-0", FAILING, edit.get("kq_soft_max-0", FAILING) + 0.002)
    edit.save()
    return dst


def nasty_dump(dst: Path) -> Path:
    """The failing copy with kq_soft_max-0 renamed to NASTY_NODE wherever a header names it."""
    failing_copy(dst)
    text = dst.read_bytes().decode("latin-1")
    assert text.count("kq_soft_max-0") >= 2  # its own header and the kqv that reads it
    dst.write_bytes(text.replace("kq_soft_max-0", NASTY_NODE).encode("utf-8"))
    return dst


def nasty_model(dst: Path, token: int = 257) -> Path:
    """A copy of the shipped GPT-2 model whose token `token` reads NASTY (metadata and tensors copied as they are)."""
    from gguf_edit import copy_model

    def value(name, v):
        if name == "tokenizer.ggml.tokens":
            v = list(v)
            v[token] = NASTY
        return v
    return copy_model(GPT2, dst, value=value)
