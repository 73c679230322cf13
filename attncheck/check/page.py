"""What the HTML page draws per attention site, collected while evaluations stream through verify.

`verify(dump, on_site=PageData(...))` hands each SiteReport here while its evaluation's nodes are still there. Per
site this keeps, in compact form: the printed P and O of each printed head (queries × printed slots or dims), the
per-head figures of every check (results.HeadFigures), the failing elements with their dumped and recomputed values
and bounds, and with --model the reference P over the visible slots (n_past + t + 1 per query, not the empty cache
slots) and the reference O over every dim. Arrays are float32 in base64 (4 bytes a value, NaN and inf kept); no
text of the evaluation is kept, so memory grows with the number of sites, not with the size of the dump.

The checks do not know of this module: it reads their results and the printed nodes the sites name.
"""
from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from ..dump.graph import Evaluation, Site
from ..dump.sample import parse_sample
from ..results import CheckResult, SiteReport

P_CHECKS = {"masked", "softmax", "softmax_ratio", "model_softmax"}  # checks whose elements are weights P[h, t, slot]
O_CHECKS = {"pv", "model_kqv", "model_flash_attn"}  # checks whose elements are outputs O[h, t, dim]


def pack(a: np.ndarray | None) -> str | None:
    """An array as base64 of little-endian float32, C order (the page decodes it into a Float32Array)."""
    if a is None:
        return None
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def unpack(text: str, shape: tuple[int, ...]) -> np.ndarray:
    """pack() read back (the tests read the page's data with it)."""
    return np.frombuffer(base64.b64decode(text), dtype="<f4").reshape(shape)


def number(x: float) -> float | str:
    """A figure for the page's JSON: 4 significant digits; inf and nan as strings (JSON has neither)."""
    if math.isnan(x) or math.isinf(x):
        return str(x)
    return float(f"{x:.4g}")


def figures(results: list[CheckResult]) -> tuple[dict[int, list], list | None]:
    """Per head [elements compared, failed, worst ratio, the check with it] over the checks that name a head per
    element; the same over the others (the SOFT_MAX sum line, cache views, whole-layer nodes), or None."""
    heads: dict[int, list] = {}
    layer: list | None = None
    for r in results:
        parts = r.by_head.items() if r.by_head is not None else [(None, (r.checked, r.failed, r.ratio))]
        for h, (n, failed, ratio) in parts:
            cur = heads.setdefault(h, [0, 0, 0.0, ""]) if h is not None else layer
            if cur is None:
                cur = layer = [0, 0, 0.0, ""]
            cur[0] += n
            cur[1] += failed
            if not ratio <= cur[2]:  # a NaN ratio counts as the worst
                cur[2], cur[3] = ratio, r.check
    for cur in [*heads.values(), *([layer] if layer else [])]:
        cur[2] = number(cur[2])
    return heads, layer


def _kind(r: CheckResult, sr: SiteReport) -> str:
    """P or O when a failing element of this check is drawn on that heatmap, '' otherwise."""
    if r.check in P_CHECKS or (r.check == "finite" and r.node == sr.nodes.get("kq_soft_max")):
        return "P"
    if r.check in O_CHECKS or (r.check == "finite" and r.node == sr.nodes.get("kqv")):
        return "O"
    return ""


def failures(sr: SiteReport) -> list[list]:
    """[head, P|O|'', query, slot or dim, dumped, recomputed, bound, check, node, line] of each kept failure."""
    out = []
    for r in sr.results:
        kind = _kind(r, sr)
        for f in r.failures:
            at = f.at
            x = None if at is None else (at.slot if at.slot is not None else at.dim)
            out.append([None if at is None else at.head, kind if at is not None else "",
                        None if at is None else at.query, x, f.got, f.want, f.bound, r.check, r.node, r.line])
    return out


def check_rows(sr: SiteReport) -> list[list]:
    """[check, node, line, compared, not compared, why, failed, worst ratio, note, {head: [n, failed, ratio]}]."""
    return [[r.check, r.node, r.line, r.checked, r.unchecked, r.why_unchecked, r.failed, number(r.ratio), r.note,
             None if r.by_head is None else {h: [f.checked, f.failed, number(f.ratio)] for h, f in r.by_head.items()}]
            for r in sr.results]


class PageData:
    """The collector verify feeds (on_site): one compact record per site, for the HTML page (check/html.py)."""

    def __init__(self, source: str, heads: frozenset[int] | None = None):
        self.source = source
        self.heads = heads  # --head: only these heads are kept
        self.sites: list[dict] = []
        self.tokens: dict[int, list[int]] = {}  # run → its token ids, when the log printed them

    def __call__(self, ev: Evaluation, sr: SiteReport, reference: Any = None) -> None:
        if ev.tokens:
            self.tokens.setdefault(ev.run, list(ev.tokens))
        site = next((s for s in ev.sites if s.softmax.line == sr.line), None)
        P = parse_sample(site.softmax, self.source) if site is not None else None
        O = self._output(ev, sr, site)
        printed = P.index[1] if P is not None else O[1][0] if O is not None else np.arange(0)
        heads = printed if self.heads is None else printed[np.isin(printed, sorted(self.heads))]
        fig, layer_fig = figures(sr.results)
        rec = {
            "e": sr.evaluation, "run": sr.run, "l": sr.layer, "n_past": sr.n_past, "T": sr.T, "n_kv": sr.n_kv,
            "H": sr.H, "H_kv": sr.H_kv, "D_h": sr.D_h, "scale": number(sr.kq_scale), "passed": sr.passed,
            "nodes": {k: v for k, v in sr.nodes.items() if v is not None},
            "lines": {"P": site.softmax.line if site else None, "O": site.kqv.line if site and site.kqv else None},
            "heads": [int(h) for h in heads], "fig": fig, "lfig": layer_fig,
            "checks": check_rows(sr), "fails": failures(sr),
            "q": [], "s": [], "d": [], "P": None, "O": None, "rP": None, "rO": None, "rheads": [],
        }
        if P is not None:
            keep = np.isin(P.index[1], heads)
            rec.update(q=P.index[2].tolist(), s=P.index[3].tolist(), P=pack(P.values[0][keep]))
        if O is not None:
            values, index = O
            keep = np.isin(index[0], heads)
            rec.update(q=index[1].tolist(), d=index[2].tolist(), O=pack(values[keep]))
        if reference is not None:
            self._reference(rec, reference, sr)
        self.sites.append(rec)

    def _output(self, ev: Evaluation, sr: SiteReport, site: Site | None):
        """The printed O as ([h, t, d] values, (heads, queries, dims)): kqv {D_h, T, H}, or FLASH_ATTN_EXT's
        {D_h, H, T} output when flash attention replaced the three nodes."""
        if site is not None:
            if site.kqv is None or site.kqv.quantized:
                return None
            O = parse_sample(site.kqv, self.source)
            return O.values[0], (O.index[1], O.index[2], O.index[3])
        flash = next((n for n in ev.flash if n.line == sr.line), None)
        if flash is None or flash.quantized or flash.cut:
            return None
        O = parse_sample(flash, self.source)
        return O.values[0].transpose(1, 0, 2), (O.index[2], O.index[1], O.index[3])

    def _reference(self, rec: dict, reference: Any, sr: SiteReport) -> None:
        """The reference P of every query over its visible slots (rows of n_past + t + 1 values, one after the
        other) and O over every dim, for each head the page keeps (all H of them unless --head)."""
        try:
            P = np.asarray(reference.get(sr.layer, "kq_soft_max"))  # [H, T_run, T_run]
            O = np.asarray(reference.get(sr.layer, "kqv"))  # [H, T_run, D_h]
        except KeyError:
            return
        n_past, T = sr.n_past, sr.T
        if P.ndim != 3 or P.shape[1] < n_past + T or O.shape[:2] != P.shape[:2]:
            return
        heads = np.arange(P.shape[0]) if self.heads is None else np.array(sorted(self.heads & set(range(len(P)))))
        rows = [P[heads, n_past + t, : n_past + t + 1] for t in range(T)]
        rec.update(rP=pack(np.concatenate(rows, axis=1) if rows else None), rO=pack(O[heads, n_past:n_past + T]),
                   rheads=heads.tolist(), rD=int(O.shape[2]))
