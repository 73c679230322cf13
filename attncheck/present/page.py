"""What the HTML page draws per attention site, collected while evaluations stream through verify.

`verify(dump, observe=PageData(...))` shows each evaluation here while its nodes are still there, and each
SiteReport once its run's facts are pinned. Per site this keeps, in compact form: the printed P and O of each
printed head (queries × printed slots or dims), the per-head figures of every check (results.HeadFigures), the
failing elements with their dumped and recomputed values and bounds, why each drawn slot is masked (sites/mask.py),
and with --model the reference P over the slots up to each query's own position (not the empty cache slots) and the
reference O over every dim. Arrays are float32 in base64 (4 bytes a value, NaN and inf kept); no text of the
evaluation is kept, so memory grows with the number of sites, not with the size of the dump.

The checks do not know of this module: it reads their results and the printed nodes the sites name.
"""
from __future__ import annotations

import base64
import math
from typing import Any, Callable

import numpy as np

from ..arch.facts import Window
from ..dump.attention import Site
from ..dump.graph import Evaluation
from ..dump.sample import parse_sample
from ..results import CheckResult, SiteReport
from ..sites.mask import Geometry, Mask, SiteFacts, full_mask

P_CHECKS = {"masked", "softmax", "softmax_ratio", "model_softmax"}  # checks whose elements are weights P[h, t, slot]
O_CHECKS = {"pv", "model_kqv", "model_flash_attn"}  # checks whose elements are outputs O[h, t, dim]


VARINT_LIMIT = 1e14  # |x|·1e4 below 2^63 and exact in a JavaScript number: larger printed values go as float32


def pack(a: np.ndarray | None) -> str | None:
    """An array as "f:" + base64 of little-endian float32, C order (the page decodes it into a Float32Array)."""
    if a is None:
        return None
    return "f:" + base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def pack_printed(a: np.ndarray) -> str:
    """Printed values (`%12.4f`: whole multiples of 1e-4) exactly and compactly: "v:" + base64 of one varint per
    value, zigzag(x·1e4) + 3, with 0, 1, 2 for nan, inf, -inf (a masked weight, 0, takes one byte). Values beyond
    VARINT_LIMIT go as float32 (pack)."""
    x = np.asarray(a, dtype=np.float64).ravel()
    finite = np.isfinite(x)
    if np.any(np.abs(x[finite]) >= VARINT_LIMIT):
        return pack(a)  # type: ignore[return-value]
    n = np.rint(np.where(finite, x, 0.0) * 1e4).astype(np.int64)
    code = ((n << 1) ^ (n >> 63)).astype(np.uint64) + np.uint64(3)
    code = np.where(np.isnan(x), 0, np.where(x == np.inf, 1, np.where(x == -np.inf, 2, code))).astype(np.uint64)
    size = np.ones(len(code), np.int64)
    for k in range(1, 10):
        size += code >= np.uint64(1 << (7 * k))
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    out = np.zeros(int(size.sum()), np.uint8)
    for k in range(int(size.max(initial=0))):
        sel = size > k
        byte = (code[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        out[start[sel] + k] = (byte | np.where(size[sel] > k + 1, 0x80, 0).astype(np.uint64)).astype(np.uint8)
    return "v:" + base64.b64encode(out.tobytes()).decode("ascii")


def unpack(text: str, shape: tuple[int, ...]) -> np.ndarray:
    """pack() or pack_printed() read back (the tests read the page's data with it)."""
    kind, data = text.split(":", 1)
    raw = base64.b64decode(data)
    if kind == "f":
        return np.frombuffer(raw, dtype="<f4").reshape(shape)
    values, v, shift = [], 0, 0
    for b in raw:
        v |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            values.append([np.nan, np.inf, -np.inf][v] if v < 3 else ((v - 3) >> 1 ^ -((v - 3) & 1)) / 1e4)
            v, shift = 0, 0
    return np.array(values).reshape(shape)


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


def check_rows(sr: SiteReport, heads: list[int], text: Callable[[str], int]) -> list[list]:
    """[check, node, line, compared, not compared, why, failed, worst ratio, note, per head] per check; strings as
    their index in the dump's string table (text), per head [n, failed, ratio] for each kept head (0: none)."""
    rows = []
    for r in sr.results:
        per_head = 0 if r.by_head is None else [
            [f.checked, f.failed, number(f.ratio)] if (f := r.by_head.get(h)) else 0 for h in heads]
        rows.append([text(r.check), text(r.node), r.line, r.checked, r.unchecked, text(r.why_unchecked), r.failed,
                     number(r.ratio), text(r.note), per_head])
    return rows


class PageData:
    """The collector verify feeds (verify.Observer): what the page draws of each site's printed nodes (and of the
    reference) as its evaluation streams by, completed by the site's figures when the report takes its SiteReport
    (after the run's facts were pinned). Records stay in this compact form; the evaluation is not kept."""

    def __init__(self, source: str, heads: frozenset[int] | None = None, layers: frozenset[int] | None = None):
        self.source = source
        self.heads = heads  # --head: only these heads are kept
        self.layers = layers  # --layer: only these layers are kept
        self.sites: list[dict] = []  # in report order
        self.tokens: dict[int, list[int]] = {}  # run → its token ids, when the log printed them
        self._printed: dict[tuple[int, int], dict] = {}  # (evaluation, line of P or flash) → printed values
        self._reference: dict[tuple[int, int], dict] = {}  # (evaluation, layer) → the reference's
        self.strings: list[str] = []  # what the checks' rows say, each once (node names, why not compared, notes)
        self._string: dict[str, int] = {}

    def text(self, s: str | None) -> int:
        """The index of a string in the string table (added on first use)."""
        s = s or ""
        if s not in self._string:
            self._string[s] = len(self.strings)
            self.strings.append(s)
        return self._string[s]

    def evaluation(self, ev: Evaluation, reference: Any = None) -> None:
        if ev.tokens:
            self.tokens.setdefault(ev.run, list(ev.tokens))
        for site in ev.sites:
            if self.layers is None or site.layer in self.layers:
                self._printed[(ev.index, site.softmax.line)] = self._site(site, ev.n_past or 0)
        for node in ev.flash:
            self._printed[(ev.index, node.line)] = self._flash(node, ev.n_past or 0)
        if reference is not None:
            for layer, kind in ev.layer_kinds().items():
                if kind in ("softmax", "flash") and (self.layers is None or layer in self.layers):
                    self._reference[(ev.index, layer)] = self._ref(reference, layer, ev.n_past or 0, ev.T or 0)

    def site(self, sr: SiteReport) -> None:
        printed = self._printed.pop((sr.evaluation, sr.line), None) or {"geometry": None}
        fig, layer_fig = figures(sr.results)
        heads = [h for h in printed.pop("all_heads", []) if self.heads is None or h in self.heads]
        rec = {
            "e": sr.evaluation, "run": sr.run, "l": sr.layer, "n_past": sr.n_past, "T": sr.T, "n_kv": sr.n_kv,
            "H": sr.H, "H_kv": sr.H_kv, "D_h": sr.D_h, "scale": number(sr.kq_scale), "passed": sr.passed,
            "nodes": {k: v for k, v in sr.nodes.items() if v is not None}, "facts": sr.facts,
            "heads": heads, "fig": fig, "lfig": layer_fig, "checks": check_rows(sr, heads, self.text),
            "fails": failures(sr),
            "q": [], "s": [], "d": [], "P": None, "O": None, "rP": None, "rO": None, "rheads": [],
            **printed, **self._reference.pop((sr.evaluation, sr.layer), {}),
        }
        geometry = rec.pop("geometry")
        rec.update(mask_codes(geometry, sr, rec))
        self.sites.append(rec)

    def _keep(self, heads: np.ndarray) -> np.ndarray:
        return np.ones(len(heads), bool) if self.heads is None else np.isin(heads, sorted(self.heads))

    def _site(self, site: Site, n_past: int) -> dict:
        """The printed P [h, t, slot] and O [h, t, dim] of the kept heads, and where the site's slots sit."""
        P = parse_sample(site.softmax, self.source)
        keep = self._keep(P.index[1])
        out = {"all_heads": P.index[1].tolist(), "q": P.index[2].tolist(), "s": P.index[3].tolist(),
               "P": pack_printed(P.values[0][keep]),
               "geometry": Geometry(n_past, site.T, site.n_kv, site.kv_cached)}
        if site.kqv is not None and not site.kqv.quantized:
            O = parse_sample(site.kqv, self.source)
            out.update(d=O.index[3].tolist(), O=pack_printed(O.values[0][self._keep(O.index[1])]))
        return out

    def _flash(self, node, n_past: int) -> dict:
        """FLASH_ATTN_EXT prints O only, as {D_h, H, T}: kept as [h, t, dim]."""
        out: dict = {"geometry": Geometry(n_past, node.ne[2], 0, True)}
        if not node.quantized and not node.cut:
            O = parse_sample(node, self.source)
            heads = O.index[2]
            out.update(all_heads=heads.tolist(), q=O.index[1].tolist(), d=O.index[3].tolist(),
                       O=pack_printed(O.values[0].transpose(1, 0, 2)[self._keep(heads)]))
        return out

    def _ref(self, reference: Any, layer: int, n_past: int, T: int) -> dict:
        """The reference P of every query over the slots up to its own position (rows of n_past + t + 1 values, one
        after the other) and O over every dim, for each head the page keeps (all H of them unless --head)."""
        try:
            P = np.asarray(reference.get(layer, "kq_soft_max"))  # [H, T_run, T_run]
            O = np.asarray(reference.get(layer, "kqv"))  # [H, T_run, D_h]
        except KeyError:
            return {}
        if P.ndim != 3 or P.shape[1] < n_past + T or O.shape[:2] != P.shape[:2] or not T:
            return {}
        heads = np.flatnonzero(self._keep(np.arange(P.shape[0])))
        rows = np.concatenate([P[heads, n_past + t, : n_past + t + 1] for t in range(T)], axis=1)
        return {"rP": pack(rows), "rO": pack(O[heads, n_past:n_past + T]), "rheads": heads.tolist(),
                "rD": int(O.shape[2])}


def mask_codes(geometry: Geometry | None, sr: SiteReport, rec: dict) -> dict:
    """Why each slot the page draws is masked (sites/mask.py's reasons under the site's facts): `mask` for the printed
    queries × printed slots, `gaps` the visible slots each printed query has in each run of unprinted slots, and with
    the reference `rmask` for every query × the slots 0..n_tokens − 1 and the printed ones past them. None where the
    slots' positions are unknown (a windowed cache that reused slots)."""
    if geometry is None or not geometry.n_kv or not geometry.positions_known:
        return {"mask": None, "gaps": None, "rmask": None, "slot_base": 0}
    w = sr.facts.get("window")
    facts = SiteFacts(sr.kq_scale, causal=sr.facts.get("mask", "causal") != "non-causal",
                      window=Window(w["n_swa"], w["kind"]) if w else None)
    q, s = np.array(rec["q"], dtype=np.int64), np.array(rec["s"], dtype=np.int64)
    text = lambda m: "".join(map(str, m.reason.ravel().tolist()))  # noqa: E731
    gaps = []
    if len(q):
        vis = full_mask(geometry, facts, q).visible  # [t, n_kv]
        bounds = np.concatenate([[-1], s, [geometry.n_kv]])
        gaps = [[int(vis[:, a + 1:b].sum(axis=1)[k]) for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]
                for k in range(len(q))]
    out = {"mask": text(Mask(geometry, facts, q, s)), "gaps": gaps, "rmask": None, "slot_base": geometry.slot_base}
    if rec.get("rP") is not None:
        n = geometry.n_tokens
        slots = np.union1d(np.arange(n), s[s >= n])
        out.update(rmask=text(Mask(geometry, facts, np.arange(geometry.T), slots)), rslots=slots.tolist())
    return out
