"""`inspect --model` on a flash-attention dump: the head walked from the model's reference forward pass.

FLASH_ATTN_EXT prints only its output {D_h, H, T}: no scores, no weights. With a model the walk still has them: the
reference's q, scores and softmax over every visible slot, and its kqv beside the dumped flash output, with the
--model checks of the layer restricted to the head (`check --model` says the same)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from rich import box
from rich.console import Console
from rich.panel import Panel

from ..sites.heads import kv_head
from ..dump.graph import Dump, read_dump
from ..dump.sample import parse_sample
from ..errors import DumpError, markup as escape
from .model_walk import FullRow, ModelWalk
from .render_model import model_walk_dict, render_model_walk
from .walk import span


@dataclass(frozen=True)
class FlashHead:
    """Where a flash walk is: what render_model needs of a walk (query, head), and the header's facts."""

    source: str
    evaluation: int
    run: int
    n_past: int
    T: int
    layer: int
    head: int
    H: int
    H_kv: int
    D_h: int
    query: int
    node: str
    line: int
    tokens: tuple[int, ...] | None

    @property
    def position(self) -> int:
        return self.n_past + self.query


def flash_walk(dump: Dump | str, layer: int, head: int, model, query: int | None = None,
               evaluation: int = 0, kq_scale: float | None = None,
               tokens: tuple[int, ...] | None = None) -> tuple[FlashHead, ModelWalk]:
    """The reference's walk of one head of a flash-attention layer; DumpError names the valid range."""
    from ..arch.context import open_model
    from ..model.checker import ModelChecker

    if not isinstance(dump, Dump):
        dump = read_dump(dump)
    model = open_model(model)
    checker = ModelChecker(model.path, dump.source, kq_scale=kq_scale, tokens=tokens, header=model.header,
                           layers=frozenset({layer}), heads=frozenset({head}))
    n_ev = 0
    for ev in dump.evaluations():
        n_ev += 1
        if ev.index != evaluation:
            checker.check(ev)  # the run's reference follows every evaluation
            ev.nodes.clear()
            continue
        flash = ev.flash_layers()
        if layer not in flash:
            unplaced = len(ev.flash) - len(flash)
            raise DumpError(dump.source, None, f"layer {layer} has no flash attention in evaluation {evaluation}: "
                                               f"layers {span(sorted(flash)) if flash else 'none'}"
                                               + (f"; {unplaced} FLASH_ATTN_EXT node(s) name no layer of their own "
                                                  "and read a cache another one reads too" if unplaced else ""))
        node = flash[layer]
        D_h, H, T = node.ne[0], node.ne[1], node.ne[2]
        if not 0 <= head < H:
            raise DumpError(dump.source, node.line, f"head {head} does not exist: heads 0..{H - 1}")
        q = T - 1 if query is None else query
        if not 0 <= q < T:
            raise DumpError(dump.source, node.line, f"query {q} does not exist: queries 0..{T - 1} (T = {T})")
        reports = [sr for sr in checker.check(ev) if sr.layer == layer]
        expected, arithmetic = checker.current  # type: ignore[misc]
        ref = expected.ref
        n_past = ev.n_past or 0
        pos, H_kv = n_past + q, reports[0].H_kv if reports else H
        sample = parse_sample(node, dump.source)
        out = np.full(D_h, np.nan)
        tq, th = sample.position(1, q), sample.position(2, head)
        if tq is not None and th is not None:
            out[sample.index[3]] = sample.values[0, tq, th]
        slots = np.arange(pos + 1)
        none = lambda n: np.full(n, np.nan)  # noqa: E731  (flash attention prints no q row, scores or weights)
        rows = (FullRow("q", None, np.arange(D_h), np.asarray(ref.get(layer, "Qcur"))[pos, head], none(D_h)),
                FullRow("kq", None, slots, np.asarray(ref.get(layer, "kq"))[head, pos, :pos + 1], none(pos + 1)),
                FullRow("kq_soft_max", None, slots, np.asarray(ref.get(layer, "kq_soft_max"))[head, pos, :pos + 1],
                        none(pos + 1)),
                FullRow("kqv", node.name, np.arange(D_h), np.asarray(ref.get(layer, "kqv"))[head, pos], out))
        g = int(kv_head(head, H, H_kv))
        mw = ModelWalk(model.path, ref.hparams.arch, arithmetic, rows,
                       np.asarray(ref.get(layer, "k_view"))[g, :pos + 1],
                       np.asarray(ref.get(layer, "v_view"))[g, :, :pos + 1].T,
                       tuple(r for sr in reports for r in sr.results))
        run_tokens = next((r.tokens for r in dump.runs if r.tokens is not None), None) if dump.runs else None
        where = FlashHead(dump.source, ev.index, ev.run, n_past, T, layer, head, H, H_kv, D_h, q, node.name,
                          node.line, tokens or run_tokens)
        return where, mw
    raise DumpError(dump.source, None, f"evaluation {evaluation} does not exist: evaluations {span(range(n_ev))}")


def render_flash(f: FlashHead, mw: ModelWalk, console: Console) -> None:
    token = "" if f.tokens is None or f.position >= len(f.tokens) else f", token {f.tokens[f.position]}"
    console.print(Panel("\n".join([
        f"[bold]{escape(f.source)}[/]  evaluation {f.evaluation} (run {f.run}, n_past {f.n_past}, T {f.T})  "
        f"layer {f.layer}  head {f.head} of 0..{f.H - 1}",
        f"flash attention: {escape(f.node)} (line {f.line}) prints only its output O {{D_h, H, T}}; the scores "
        "and weights below are the model's reference",
        f"D_h = {f.D_h}   query {f.query}: position {f.position}{token}",
    ]), title="attncheck inspect (flash attention, from the model)", title_align="left", box=box.ROUNDED))
    render_model_walk(f, mw, console)


def flash_dict(f: FlashHead, mw: ModelWalk) -> dict:
    from .. import __version__

    return {"schema": 1, "tool": "attncheck", "command": "inspect", "version": __version__, "source": f.source,
            "flash_attention": {"node": f.node, "line": f.line},
            "evaluation": f.evaluation, "run": f.run, "n_past": f.n_past, "T": f.T, "layer": f.layer,
            "head": f.head, "H": f.H, "H_kv": f.H_kv, "D_h": f.D_h,
            "query": {"index": f.query, "position": f.position}, "passed": mw.passed, "model": model_walk_dict(mw)}
