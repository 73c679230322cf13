"""The dump-only checker: every attention site of an evaluation recomputed from other printed numbers.

Per site: printed values are numbers, masked weights are 0, softmax of whole rows, weight ratios of the others,
P·V, the SOFT_MAX sum line. Over the dump: kq_scale inferred from the data, and a hint when it would explain the
softmax failures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..errors import DumpError
from ..dump.graph import Evaluation, Site
from ..dump.sample import parse_sample
from ..results import FixedTolerance, SiteReport
from . import checks
from .heads import SiteView, select_heads, site_view


def default_scale(site: Site) -> float:
    """llama.cpp passes kq_scale = 1/sqrt(D_h) for GPT-2 and Llama (D_h = ne0 of q)."""
    return 1.0 / math.sqrt(site.D_h) if site.D_h else 1.0


@dataclass
class DumpSummary:
    """What the dump-only checks keep of a whole dump for the report."""

    layers_seen: set[int] = field(default_factory=set)  # layers with an attention site, checked or filtered out
    inferred_kq_scale: float | None = None
    inferred_rows: int = 0
    hint: str = ""


@dataclass
class DumpChecker:
    """Checks each site of each evaluation from the dump alone (the Checker interface of checker.py)."""

    source: str
    kq_scale: float | None = None  # None: 1/sqrt(D_h) per site
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    tolerance: FixedTolerance | None = None
    _num: float = 0.0  # infer_scale's pooled sums
    _den: float = 0.0
    _rows: int = 0
    _failed: list[SiteView] = field(default_factory=list)  # views whose softmax checks failed, for the hint
    _summary: DumpSummary = field(default_factory=DumpSummary)

    def check(self, ev: Evaluation) -> list[SiteReport]:
        out = []
        for site in ev.sites:
            self._summary.layers_seen.add(site.layer)
            if self.layers is not None and site.layer not in self.layers:
                continue
            sr, view = self._site(ev, site)
            n, d, r = checks.infer_scale(view)
            self._num, self._den, self._rows = self._num + n, self._den + d, self._rows + r
            if any(not c.passed for c in sr.results if c.check in ("softmax", "softmax_ratio")):
                self._failed.append(view)
            out.append(sr)
        return out

    def _site(self, ev: Evaluation, site: Site) -> tuple[SiteReport, SiteView]:
        src = self.source
        if ev.n_past is None:
            raise DumpError(src, site.softmax.line, "cannot place this evaluation: an earlier one had no attention "
                                                    "to count T")
        P = parse_sample(site.softmax, src)
        S = parse_sample(site.scores, src) if site.scores is not None and not site.scores.quantized else None
        O = parse_sample(site.kqv, src) if site.kqv is not None else None
        V = parse_sample(site.v, src) if site.v is not None and not site.v.quantized else None
        view = site_view(site, ev.n_past, P, S, O, V, src)
        if self.heads is not None:
            view = select_heads(view, set(self.heads))
        scale = self.kq_scale if self.kq_scale is not None else default_scale(site)
        tol = self.tolerance
        results = [
            *checks.finite(view),
            checks.masked(view),
            checks.softmax_rows(view, scale, tol),
            checks.softmax_ratio(view, scale, tol),
            checks.pv(view, tol),
        ]
        if self.heads is None:
            results.append(checks.softmax_sum(view, P.sums, P.values, tol))
        sr = SiteReport(
            evaluation=ev.index, run=ev.run, n_past=ev.n_past, T=site.T, layer=site.layer,
            H=site.H, H_kv=site.H_kv, D_h=site.D_h, n_kv=site.n_kv, kq_scale=scale,
            nodes={"kq": site.kq.name if site.kq else None, "kq_soft_max": site.softmax.name,
                   "kqv": site.kqv.name if site.kqv else None, "v": site.v.name if site.v else None},
            line=site.softmax.line,
            results=results,
            rows_whole=int(view.rows_whole.sum()) * len(view.heads),
            rows_printed=len(view.queries) * len(view.heads),
        )
        return sr, view

    def finish(self, complete: bool = True) -> DumpSummary:
        s = self._summary
        if self._den > 0:
            s.inferred_kq_scale, s.inferred_rows = self._num / self._den, self._rows
        s.hint = self._hint()
        return s

    def _hint(self) -> str:
        """When the softmax checks fail and the scale inferred from the data would pass them, say so.

        The estimate carries print noise, so 1/sqrt(D_h) is tried first when it lies within 1% of it.
        """
        s = self._summary.inferred_kq_scale
        if not self._failed or s is None:
            return ""
        candidates = [s]
        canonical = default_scale(self._failed[0].site)
        if abs(s / canonical - 1) < 0.01:
            candidates.insert(0, canonical)
        tol = self.tolerance
        for c in candidates:
            if all(checks.softmax_rows(v, c, tol).passed and checks.softmax_ratio(v, c, tol).passed
                   for v in self._failed):
                name = " = 1/sqrt(D_h)" if c == canonical else ""
                return (f"the data suggest kq_scale = {c:.6g}{name} (inferred {s:.6g} from "
                        f"{self._summary.inferred_rows} rows); pass --kq-scale {c:.6g} if the model uses it")
        return ""
