"""Evaluation → what the dump-only checks need of it: each attention site's printed numbers as a per-head view,
the printed steps between kq and SOFT_MAX, and the evaluation's layers. Small and picklable, so that a worker
process can gather evaluations while the parent pins facts and checks (verify.py)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..dump.attention import Site, SiteInfo
from ..dump.graph import Evaluation
from ..dump.sample import Sample, parse_samples, parse_sample
from ..errors import DumpError
from . import steps
from ..sites.heads import SiteView, site_view
from ..sites.mask import Geometry


@dataclass
class Pending:
    """A site waiting for its run's facts."""

    evaluation: int
    run: int
    site: SiteInfo
    view: SiteView  # every printed head (facts are pinned on all of them)
    steps: list[steps.Step]


@dataclass
class EvalData:
    """One evaluation as the dump-only checks take it in (DumpChecker.absorb)."""

    index: int
    run: int
    n_past: int | None
    T: int | None
    pending: list[Pending]
    layers_seen: set[int] = field(default_factory=set)  # layers with a site, checked or filtered out by --layer
    layer_kinds: dict[int, str] = field(default_factory=dict)
    other_softmax: tuple[str, ...] = ()  # SOFT_MAX nodes that are not attention, as "name (line N)"
    flash: int = 0  # FLASH_ATTN_EXT nodes
    runs_before: int = 0  # run starts read before it in its part (dump/pool.py)
    tokens: tuple[int, ...] | None = None

    def placed(self, source: str) -> None:
        """Its sites numbered as the evaluation, once dump/pool.py's Replay has placed it in the dump."""
        if self.n_past is None and self.pending:
            raise DumpError(source, self.pending[0].site.softmax.line,
                            "cannot place this evaluation: an earlier one had no attention to count T")
        placed: dict[Geometry, Geometry] = {}  # the evaluation's sites share a few geometries
        for p in self.pending:
            p.evaluation, p.run = self.index, self.run
            g = p.view.geometry
            if g.n_past != self.n_past:  # read in a part that did not start at the run's start
                if g not in placed:
                    placed[g] = Geometry(self.n_past, g.T, g.n_kv, g.cached)
                p.view = p.view.placed(placed[g])


def gather(ev: Evaluation, source: str, layers: frozenset[int] | None = None) -> EvalData:
    """An evaluation's sites (of --layer's layers) parsed into views, with its layers and other SOFT_MAXes."""
    sites = [site for site in ev.sites if layers is None or site.layer in layers]
    # every site's printed scores, weights, output and V parsed in one pass (dump/sample.py's parse_samples); a node
    # it leaves is parsed alone when its site comes, so that damage is named where reading one by one names it
    nodes = [n for site in sites for n in (site.softmax, site.scores, site.kqv, site.v) if n is not None]
    parsed = {id(n): s for n, s in zip(nodes, parse_samples(nodes)) if s is not None}
    pending = [_pending(ev, site, source, parsed) for site in sites]
    return EvalData(ev.index, ev.run, ev.n_past, ev.T, pending, {s.layer for s in ev.sites}, ev.layer_kinds(),
                    tuple(f"{n.name} (line {n.line})" for n in ev.other_softmax), len(ev.flash), ev.runs_before,
                    ev.tokens)


def _pending(ev: Evaluation, site: Site, src: str, parsed: dict[int, Sample]) -> Pending:
    if ev.n_past is None:
        raise DumpError(src, site.softmax.line, "cannot place this evaluation: an earlier one had no attention "
                                                "to count T")
    sample = lambda n: parsed.get(id(n)) or parse_sample(n, src)  # noqa: E731
    P = sample(site.softmax)
    S = sample(site.scores) if site.scores is not None and not site.scores.quantized else None
    O = sample(site.kqv) if site.kqv is not None else None
    V = sample(site.v) if site.v is not None and not site.v.quantized else None
    view = site_view(site, ev.n_past, P, S, O, V, src)
    return Pending(ev.index, ev.run, view.site, view, _steps(site, S, src))  # view.site: the SiteInfo, made once


def _steps(site: Site, S, src: str) -> list[steps.Step]:
    """The printed steps between kq and SOFT_MAX, and q's pre-scale, with their printed inputs."""
    out = []
    sample = lambda n: None if n is None or n.quantized else parse_sample(n, src)  # noqa: E731
    chain = site.steps()
    pre = site.q_scale_node()
    after = [n.op for n in chain[1:]] + ["SOFT_MAX"]
    todo = [(f"scores.{i}", n, after[i]) for i, n in enumerate(chain)] + ([("q", pre, "MUL_MAT")] if pre else [])
    for key, n, before in todo:
        y = S if n is site.scores and S is not None else sample(n)
        a_node, b_node = n.inputs
        a = sample(a_node) if a_node is not None and a_node.ne == n.ne else None
        b = sample(b_node) if b_node is not None and b_node.ne == n.ne and n.op == "ADD" else None
        P = steps.Printed.of
        out.append(steps.Step(key, n.ref, P(y), P(a), P(b), before, a_node.op if a_node is not None else None))
    return out
