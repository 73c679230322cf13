"""The dump-only checker: every attention site recomputed from other printed numbers, under facts pinned per run.

Per site: printed values are numbers, masked weights are 0, softmax of whole rows, weight ratios of the others,
P·V, the SOFT_MAX sum line, and the printed steps between kq and SOFT_MAX. A llama.cpp run's sites are gathered
until the run ends, its facts pinned on all of them (hypotheses.py), then checked: a fact is pinned per run, never
per row, so a wrong value cannot be explained away by a fact of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..arch.facts import AttentionFacts
from ..dump.graph import Evaluation
from ..results import CheckResult, SiteReport, Tolerance
from . import checks, scoring, steps
from .gather import EvalData, Pending, gather
from ..sites.heads import SiteView, Stack, Under, select_heads, stacks
from .fits import inferred_scale
from .hypotheses import pin
from ..sites.resolve import site_facts, sites_facts
from .scoring import FIXED, Known, Scored, fingerprints

MAX_BUFFERED = 20000  # sites of one run kept to pin its facts; past that, the rest of the run is checked as it comes
EARLY = 64  # sites of a run after which its sites are checked as they come, under facts pinned on those (see Early)


@dataclass
class DumpSummary:
    """What the dump-only checks keep of a whole dump for the report."""

    layers_seen: set[int] = field(default_factory=set)  # layers with an attention site, checked or filtered out
    layer_kinds: dict[int, str] = field(default_factory=dict)  # every numbered layer: softmax, flash, recurrent, none
    other_softmax: list[str] = field(default_factory=list)  # SOFT_MAX nodes that are not attention
    facts: list[dict] = field(default_factory=list)  # per run: the facts used, where each came from, rows pinned
    inferred_kq_scale: float | None = None
    inferred_rows: int = 0
    hint: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass
class Early:
    """A run's sites checked as they come, under facts pinned on its first EARLY sites, so that checking overlaps
    reading (-j). The run's own pin still decides: at its end, these reports stand only if every site's facts and the
    step factors are the ones they were checked under; else the run is checked again.
    Either way the reports are those of a check of the whole run under its pin: nothing depends on -j."""

    pinned: Scored
    factors: dict
    reports: list[SiteReport] = field(default_factory=list)
    failed: list[tuple[int, Under]] = field(default_factory=list)
    under: list[tuple] = field(default_factory=list)  # per site checked: what it was checked under (fingerprint)


@dataclass
class DumpChecker:
    """Checks each site of each run from the dump alone (the Checker interface of checker.py).

    given: facts from options, a model's header or the log; what it leaves at DEFAULT is pinned by hypotheses."""

    source: str
    given: AttentionFacts = field(default_factory=AttentionFacts)
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    tolerance: Tolerance | None = None
    per_head: bool = True  # keep each check's per-head figures (for the HTML page; about half a report's memory)
    _pending: list[Pending] = field(default_factory=list)
    _run: int | None = None
    _pinned: Scored | None = None  # facts pinned early, when a run outgrew MAX_BUFFERED
    _summary: DumpSummary = field(default_factory=DumpSummary)
    _failed: list[Under] = field(default_factory=list)  # views whose softmax checks failed, for the hint
    _early: Early | None = None
    _rows: Known = field(default_factory=dict)  # pending sites checked so far: their failing rows, for the run's pin

    def check(self, ev: Evaluation) -> list[SiteReport]:
        """Gather an evaluation's sites and take them in (the in-process path; workers gather, see absorb)."""
        return self.absorb(gather(ev, self.source, self.layers))

    def absorb(self, data: EvalData) -> list[SiteReport]:
        """Take in one evaluation's gathered sites, in dump order: a run's sites wait until its facts are pinned."""
        out: list[SiteReport] = []
        if self._run is not None and data.run != self._run:
            out += self._close()
        if self._run is None:
            self._run = data.run
            self._summary.layer_kinds.update(data.layer_kinds)
            self._summary.other_softmax += list(data.other_softmax)
        self._summary.layers_seen |= data.layers_seen
        self._pending += data.pending
        if self._pinned is not None:
            out += self._check_pending(self._pinned)
        elif len(self._pending) > MAX_BUFFERED:
            self._pinned = self._pin()
            out += self._check_pending(self._pinned)
        else:
            self._check_early()
        return out

    def finish(self, complete: bool = True) -> tuple[list[SiteReport], DumpSummary]:
        out = self._close()
        s = self._summary
        s.hint = self._hint()
        return out, s

    # ---- pinning and checking -------------------------------------------------------------------------------

    def _pin(self) -> Scored:
        views = [p.view for p in self._pending]
        scored, tried = pin(views, self.given, self._rows)
        record = {"run": self._pending[0].run if self._pending else self._run, **scored.facts.to_dict(),
                  "rows": scored.rows, "rows_failing": scored.failing, "rows_informative": scored.informative,
                  "tried": list(dict.fromkeys(tried))}
        self._summary.facts.append(record)
        got = inferred_scale(views, scored.facts) if views else None
        if got is not None:
            s = self._summary
            rows = s.inferred_rows + got[1]
            prev = (s.inferred_kq_scale or 0.0) * s.inferred_rows
            s.inferred_kq_scale, s.inferred_rows = (prev + got[0] * got[1]) / max(rows, 1), rows
        return scored

    def _close(self) -> list[SiteReport]:
        """The end of a run: pin its facts (unless pinned early) and check its sites."""
        if self._run is None:
            return []
        pinned = self._pinned or self._pin()
        out = self._check_pending(pinned)
        self._run, self._pinned = None, None
        return out

    def _check_early(self) -> None:
        """Past EARLY sites of a run, check its new sites under facts pinned on what it has so far (Early), EARLY at
        a time or more (fewer, larger stacks)."""
        e = self._early
        if e is None:
            if len(self._pending) < EARLY:
                return
            scored, _ = pin([p.view for p in self._pending], self.given, self._rows)
            e = self._early = Early(scored, self._factors())
        todo = self._pending[len(e.reports):]
        if len(todo) < EARLY:
            return
        reports, failed, under = self._check(todo, e.pinned, e.factors)
        e.failed += [(len(e.reports) + i, u) for i, u in failed]
        e.reports += reports
        e.under += under

    def _check_pending(self, pinned: Scored) -> list[SiteReport]:
        """Every pending site checked under the pinned facts: the early reports where they stand (Early), the rest
        now."""
        factors = self._factors()
        e, self._early = self._early, None
        done: list[SiteReport] = []
        failed: list[tuple[int, Under]] = []
        if e is not None and e.factors == factors and \
                e.under == fingerprints(sites_facts(pinned.facts, [p.view for p in self._pending[:len(e.reports)]],
                                                    pinned.extra)):
            done, failed = e.reports, e.failed
        reports, more, _ = self._check(self._pending[len(done):], pinned, factors)
        failed += [(len(done) + i, u) for i, u in more]
        self._failed += [u for _, u in sorted(failed, key=lambda f: f[0])]
        self._pending = []
        self._rows.clear()  # kept only for views still pending: an id is a view's only while the view lives
        return done + reports

    def _check(self, pending: list[Pending], pinned: Scored, factors: dict) -> tuple[list[SiteReport], list[tuple[int, Under]], list[tuple]]:
        """Sites checked under pinned facts, stack by stack (sites of one printed shape at once): their reports, the
        views whose softmax checks failed (by index, for the hint), and what each was checked under."""
        facts = sites_facts(pinned.facts, [p.view for p in pending], pinned.extra)
        views = [p.view if self.heads is None else select_heads(p.view, set(self.heads)) for p in pending]
        under = fingerprints(facts)
        out: list[SiteReport | None] = [None] * len(views)
        failed: list[tuple[int, Under]] = []
        for idx, st in stacks(views, facts):
            reports, bad = self._reports(st, [pending[i] for i in idx], factors, [under[i] for i in idx])
            for k, sr in zip(idx, reports):
                out[k] = sr
            failed += [(idx[k], u) for k, u in bad]
        return out, failed, under  # type: ignore[return-value]

    def _factors(self) -> dict[str, tuple[float, float] | None]:
        """Each SCALE step's factor: from the model (the soft-cap around a TANH, q's pre-scale), else pinned on
        every printed element of the run's sites."""
        by_key: dict[str, list[steps.Step]] = {}
        for p in self._pending:
            for s in p.steps:
                if s.node.op == "SCALE" and s.a is not None:
                    by_key.setdefault(s.key, []).append(s)
        out: dict[str, tuple[float, float] | None] = {}
        for key, ss in by_key.items():
            given = self._given_factor(key, ss[0])
            if given is not None:
                out[key] = (given, 0.0)
                continue
            got = steps.pin_factor(ss)
            out[key] = None if got is None else got[:2]
        return out

    def _given_factor(self, key: str, s: steps.Step) -> float | None:
        """The factor a model fixes: q's pre-scale; 1/cap before a TANH and cap after one (soft-capping)."""
        g = self.given
        if key == "q":
            return g.q_scale.value if g.q_scale.origin in FIXED else None
        cap = g.softcap.value if g.softcap.origin in FIXED else None
        if cap:
            if s.feeds == "TANH":
                return cap
            if s.before == "TANH":
                return 1.0 / cap
        return None

    def _reports(self, st: Stack, pending: list[Pending], factors: dict,
                 under: list[tuple]) -> tuple[list[SiteReport], list[tuple[int, Under]]]:
        """The SiteReports of one stack, each check computed for all its sites at once, and the sites (by index in
        the stack) whose softmax checks failed; under: each site's facts' fingerprint."""
        tol = self.tolerance
        P_nodes = [p.site.softmax for p in pending]
        O_nodes = [p.site.kqv or p.site.softmax for p in pending]
        why = [self._why_not(v) for v in st.views]
        checked = []
        if not all(why):
            els = checks.masked(st), checks.softmax_rows(st), checks.softmax_ratio(st)
            checked = list(zip(*(
                checks.results("masked", P_nodes, st, els[0], "slot", per_head=self.per_head),
                checks.results("softmax", P_nodes, st, els[1], "slot", tol, per_head=self.per_head),
                checks.results("softmax_ratio", P_nodes, st, els[2], "slot", tol, per_head=self.per_head),
                checks.results("pv", O_nodes, st, checks.pv(st), "dim", tol, rows="O_rows", per_head=self.per_head))))
            if self.heads is None:  # the views the run's pin scores: their failing rows, not found again there
                bad = scoring.row_failures(st, els)
                for k, p in enumerate(pending):
                    self._rows[id(p.view)] = (under[k], bad[k])
        rows_whole = st.rows_whole.sum(axis=1) * len(st.heads)
        finite = checks.finite_stack(st)
        out = []
        failed: list[tuple[int, Under]] = []
        for i, (p, view) in enumerate(zip(pending, st.views)):
            site = p.site
            results = finite[i]
            if why[i]:
                results += [CheckResult(c, site.softmax.name, site.softmax.line, unchecked=view.P.size,
                                        why_unchecked=why[i]) for c in ("masked", "softmax", "softmax_ratio", "pv")]
            else:
                results += checked[i]
                if checked[i][1].failed or checked[i][2].failed:  # softmax, softmax_ratio
                    failed.append((i, Under(view, st.facts[i])))
            if self.heads is None:
                results.append(checks.softmax_sum(st, i, tol))
            results += [steps.check_step(s, factors.get(s.key)) for s in p.steps]
            out.append(SiteReport(
                evaluation=p.evaluation, run=p.run, n_past=view.n_past, T=site.T, layer=site.layer,
                H=site.H, H_kv=site.H_kv, D_h=site.D_h, n_kv=site.n_kv, kq_scale=st.facts[i].kq_scale,
                nodes={"kq": site.kq.name if site.kq else None, "kq_soft_max": site.softmax.name,
                       "kqv": site.kqv.name if site.kqv else None, "v": site.v.name if site.v else None},
                line=site.softmax.line, results=results,
                rows_whole=0 if why[i] else int(rows_whole[i]), rows_printed=len(view.queries) * len(view.heads),
                facts=_site_facts_dict(st.facts[i])))
        return out, failed

    @staticmethod
    def _why_not(view: SiteView) -> str:
        """Why a site's softmax, ratio, masked and P·V checks cannot run ('' when they can)."""
        g = view.geometry
        if not g.positions_known:
            return (f"the windowed KV cache ({g.n_kv} slots) has held {g.n_tokens} tokens: slots are reused, so "
                    "which position each holds is not printed")
        return ""

    def _hint(self) -> str:
        """When softmax checks fail under a given scale and the data's own scale would pass them, say so."""
        if not self._failed or self.given.kq_scale.origin not in FIXED:
            return ""
        got = inferred_scale([u.view for u in self._failed], self.given)
        if got is None:
            return ""
        s, rows = got
        default = site_facts(AttentionFacts(), self._failed[0].view).kq_scale
        candidates = [default, s] if abs(s / default - 1) < 0.01 else [s]
        for c in candidates:
            under = [Under(u.view, replace(u.facts, kq_scale=c)).stack for u in self._failed]
            if all(checks.softmax_rows(v).ok(self.tolerance).all() and checks.softmax_ratio(v).ok(self.tolerance).all()
                   for v in under):
                name = " = 1/sqrt(D_h)" if c == default else ""
                return (f"the data suggest kq_scale = {c:.6g}{name} (inferred {s:.6g} from {rows} rows); "
                        f"pass --kq-scale {c:.6g} if the model uses it")
        return ""


def _site_facts_dict(f) -> dict:
    out: dict = {"kq_scale": f.kq_scale, "mask": "causal" if f.causal else "non-causal"}
    if f.window is not None:
        out["window"] = {"n_swa": f.window.n, "kind": f.window.kind}
    if f.slopes is not None:
        out["alibi_slopes"] = [float(f"{x:.7g}") for x in f.slopes]
    if f.sinks is not None:
        out["sinks"] = [None if not np.isfinite(x) else round(float(x), 4) for x in f.sinks]
    if f.scale_err:
        out["kq_scale_uncertainty"] = f.scale_err
    return out

