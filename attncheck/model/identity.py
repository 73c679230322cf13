"""Whether a dump was made with a model: its printed embedding lookup must be the model's.

GET_ROWS(token_embd.weight, inp_tokens) copies the model's rows of the run's token ids (dequantized exactly), so every
printed element of it is within print precision of the model's table, whatever the build, the cache or the threads:
there is no drift to allow for. A llama.cpp bug in the lookup moves some elements; another model (of matching shapes:
the shapes are checked before) or another prompt moves nearly all of them. Past half of the printed elements, the
dump is refused as not made with this model (exit 2), rather than checked against a reference it never ran, which
would blame llama.cpp for the difference. `diff` holds OLD's printed rows to NEW's alike.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..dump.graph import Evaluation
from ..dump.sample import parse_sample
from ..errors import DumpError
from ..results import abs_error, within

if TYPE_CHECKING:  # the model's modules import gguf: `diff` without a model does without them
    from .weights import Model

EMBEDDINGS = "token_embd.weight"
PRINT = 5e-5 + 1e-9  # a printed value is within 5e-5 of the stored one (and float64 parsing of the text)
MOST = 0.5  # share of printed embedding elements beyond print precision from which a dump is another model's


def _printed(ev: Evaluation, source: str):
    """The evaluation's printed embedding rows: (node, [printed tokens, printed columns] values, token indices,
    column indices), or None when it prints none. The lookup reads an unprinted weight named token_embd.weight."""
    node = next((n for n in ev.nodes if n.op == "GET_ROWS" and n.inputs[0] is None and n.srcs[0] is not None
                 and n.srcs[0].name == EMBEDDINGS), None)
    if node is None or node.quantized or node.cut:
        return None
    try:
        s = parse_sample(node, source)
    except DumpError:
        return None  # damage: the checks that read the node say so at its line
    return node, s.values[0, 0], s.index[2], s.index[3]


def _rows(model: Model, ids: list[int]) -> np.ndarray:
    """The model's embedding rows of `ids`, as float32 [len(ids), n_embd], dequantizing those rows only."""
    from .dequant import dequantize

    raw = model.raw(EMBEDDINGS)  # [n_vocab, bytes per row], memory-mapped
    part = np.ascontiguousarray(raw[np.asarray(ids, dtype=np.int64)])
    return np.asarray(dequantize(part, model.tensor_type(EMBEDDINGS)), dtype=np.float32).reshape(len(ids), -1)


def _beyond(got: np.ndarray, want: np.ndarray) -> int:
    return int(np.count_nonzero(~within(abs_error(got.astype(np.float64), want), PRINT)))


def require_model(model: Model, ev: Evaluation, tokens: tuple[int, ...], source: str) -> None:
    """DumpError when the evaluation's printed embedding rows are not, for most of their elements, the model's rows of
    the run's token ids (tokens: the whole run's, from position 0)."""
    printed = _printed(ev, source)
    if printed is None:
        return
    node, values, rows, cols = printed
    n_past = ev.n_past or 0
    n_embd, n_vocab = model.ne(EMBEDDINGS)[:2]
    if n_past + int(rows[-1]) >= len(tokens):
        return  # fewer token ids than queries: said at the run (model/runs.py)
    ids = [tokens[n_past + int(t)] for t in rows]
    why = ""
    if node.ne[0] != n_embd:
        why = f"'{node.name}' looks up rows of {node.ne[0]} values; {model.path}'s {EMBEDDINGS} has {n_embd}"
    elif any(not 0 <= i < n_vocab for i in ids):
        why = f"token ids {ids} of '{node.name}'; {model.path}'s vocabulary has {n_vocab} tokens"
    else:
        beyond = _beyond(values, _rows(model, ids)[:, cols])
        if beyond > MOST * values.size:
            why = (f"{beyond} of the {values.size} printed values of '{node.name}', the embedding rows of token ids "
                   f"{ids}, differ from {model.path}'s beyond print precision (a lookup copies them: no build "
                   "differs there)")
    if why:
        raise DumpError(source, node.line, f"this dump was not made with this model: {why}")


def checker(path: str, header, source: str, given: tuple[int, ...] | None) -> Callable[[Evaluation], None]:
    """require_model for a model attncheck has no reference forward pass for (verify.py): its embedding table is
    read from the file all the same; the token ids are the log's (or --tokens); without either, nothing is said."""
    from .weights import Model

    model = Model(path, header, None)  # type: ignore[arg-type]  # no hyperparameters: the table is all it reads

    def check(ev: Evaluation) -> None:
        tokens = ev.tokens or given
        if tokens:
            require_model(model, ev, tuple(tokens), source)
    return check


def same_model(ea: Evaluation, eb: Evaluation, source_a: str, source_b: str) -> str:
    """'' unless the two evaluations print embedding rows of the same tokens that differ in most elements: then why
    OLD and NEW were not made with the same model (or prompt)."""
    a, b = _printed(ea, source_a), _printed(eb, source_b)
    if a is None or b is None:
        return ""
    (na, va, ra, ca), (nb, vb, rb, cb) = a, b
    if na.ne[:2] != nb.ne[:2] or not (np.array_equal(ra, rb) and np.array_equal(ca, cb)):
        return ""  # other shapes or other printed rows (--prefix): the prompt checks say what differs
    beyond = _beyond(va, vb.astype(np.float64))
    if beyond <= MOST * va.size:
        return ""
    return (f"not made with the same model and prompt: {beyond} of the {va.size} printed values of the embedding "
            f"lookup ('{na.name}', OLD line {na.line}; NEW line {nb.line}) differ beyond print precision (a lookup "
            "copies the model's rows: no build differs there)")
