"""Token ids from the printed embeddings, for logs that print none (llama.cpp before the `number of input tokens`
lines): every printed row of `GET_ROWS(token_embd.weight, ...)` is one token's embedding row, printed to 4
decimals, so the token is the row of the model's embedding table that prints the same (GET_ROWS dequantizes
exactly). Only printed rows can be looked up: an evaluation of more than 6 tokens prints its first 3 and last 3.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES

from ..dump.graph import Evaluation
from ..dump.sample import parse_sample
from ..errors import DumpError
from .dequant import dequantize
from .weights import Model

EMBEDDINGS = "token_embd.weight"
PRINT = 5e-5 + 1e-9  # a printed value is within 5e-5 of the stored one (and float64 parsing of the text)


@dataclass(frozen=True)
class Recovered:
    """Per query of the evaluation (positions n_past ..), its id or None, and why the Nones stay unknown."""

    ids: tuple[int | None, ...]
    unknown: dict[int, str]  # position -> why its id is unknown

    @property
    def complete(self) -> bool:
        return not self.unknown


def embedding_rows(ev: Evaluation):
    """The evaluation's GET_ROWS of the token embeddings (an unprinted weight named token_embd.weight)."""
    return next((n for n in ev.nodes if n.op == "GET_ROWS" and n.inputs[0] is None and n.srcs[0] is not None
                 and n.srcs[0].name == EMBEDDINGS), None)


def _columns(model: Model, cols: np.ndarray) -> np.ndarray:
    """Columns `cols` of every row of the embedding table, as float32 [n_vocab, len(cols)], dequantizing only the
    blocks that hold them."""
    ne0, n_vocab = model.ne(EMBEDDINGS)[:2]
    qtype = model.tensor_type(EMBEDDINGS)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = model.raw(EMBEDDINGS)  # [n_vocab, bytes per row], memory-mapped
    out = np.empty((n_vocab, len(cols)), dtype=np.float32)
    for b in sorted({int(c) // block for c in cols}):
        part = np.ascontiguousarray(raw[:, b * size:(b + 1) * size])
        values = np.asarray(dequantize(part, qtype), dtype=np.float32).reshape(n_vocab, block)
        for j, c in enumerate(cols):
            if int(c) // block == b:
                out[:, j] = values[:, int(c) % block]
    return out


def recover(model: Model, ev: Evaluation, source: str) -> Recovered | None:
    """The ids of the evaluation's queries, looked up from its printed embedding rows; None when the evaluation
    prints no such node (or it prints no values)."""
    node = embedding_rows(ev)
    if node is None or node.quantized or node.cut:
        return None
    try:
        s = parse_sample(node, source)
    except DumpError:
        return None
    rows, cols = s.index[2], s.index[3]  # printed tokens (i1) and embedding columns (i0)
    if model.ne(EMBEDDINGS)[0] != node.ne[0]:
        return None
    table = _columns(model, cols)
    T, n_past = node.ne[1], ev.n_past or 0
    ids: list[int | None] = [None] * T
    unknown: dict[int, str] = {t + n_past: "not recoverable, their embedding rows are not printed (an evaluation of "
                                           "more than 6 tokens prints its first 3 and last 3)" for t in range(T)}
    for r, t in enumerate(rows):
        printed = s.values[0, 0, r, :].astype(np.float64)
        match = np.flatnonzero(np.all(np.abs(table - printed) <= PRINT, axis=1))
        pos = int(t) + n_past
        if len(match) == 1:
            ids[int(t)] = int(match[0])
            del unknown[pos]
        else:
            unknown[pos] = ("not recoverable, no row of the embedding table prints as they do" if not len(match)
                            else f"ambiguous, {len(match)} rows of the embedding table print as it does (ids "
                            f"{', '.join(map(str, match[:5]))}{', ...' if len(match) > 5 else ''})")
    return Recovered(tuple(ids), unknown)
