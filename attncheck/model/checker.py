"""`--model`: every printed number of the attention (and of the layer around it) against a reference forward pass.

The checker of checker.py's interface for `--model`: per evaluation, map the printed nodes to reference quantities
(mapping.py), keep each run's reference (runs.py), compare node by node under the error model (compare.py,
bounds.py), and keep what the JSON reports (summary.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..dump.graph import Evaluation
from ..results import CheckResult, SiteReport
from .bounds import CASCADE, DEPTH, ERROR_MODELS, NMSE_MAX, regime
from .compare import NodeComparison
from .expect import Expected
from ..dump.paths import position_after_matmul
from ..dump.roles import assign
from ..dump.sample import interleaved, parse_sample
from ..errors import DumpError
from . import work
from .chains import LAYOUT, global_chains, layer_chains
from .identity import require_model
from .mapping import Layer, map_evaluation
from .runs import MissingIds, Runs
from .summary import Summary
from ..arch.gguf_header import Header
from .weights import Model, load_model


@dataclass
class ModelChecker:
    """Checks evaluations against the reference of a GGUF model; one per dump (verify.py drives it)."""

    path: str
    source: str
    kq_scale: float | None = None
    tokens: tuple[int, ...] | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    header: Header | None = None  # the model's header when the caller has read it already
    require_ids: bool = True  # False: a run whose token ids are unknown is not checked against the model (said so)
    deferred: bool = False  # True: each run checked at its end, layer by layer (check's docstring)
    model: Model = field(init=False)
    runs: Runs = field(init=False)
    summary: Summary = field(default_factory=Summary, init=False)
    activations: str = field(default="float", init=False)
    _chain_cache: dict = field(default_factory=dict, init=False)
    without_ids: dict[int, str] = field(default_factory=dict, init=False)  # run → why it was not checked
    work: "work.Work" = field(init=False)

    def __post_init__(self) -> None:
        self.model = load_model(self.path, self.header)
        first = "blk.0.attn_qkv.weight" if self.model.has("blk.0.attn_qkv.weight") else "blk.0.attn_q.weight"
        quantized = self.model.has(first) and self.model.tensor_type(first).name not in ("F32", "F16", "BF16")
        self.activations = "8-bit" if quantized else "float"
        if self.kq_scale is not None:
            self.model = self.model.with_hparams(replace(self.model.hparams, kq_scale=float(self.kq_scale)))
        self.runs = Runs(self.model, self.source, self.tokens, deferred=self.deferred)
        self.work = work.Work()
        self._compare = NodeComparison(self.source, self.activations, self.heads, self.summary)

    @property
    def current(self) -> tuple[Expected, dict] | None:
        """The reference of the run being checked, and the arithmetic chosen for it (inspect --model)."""
        run = self.runs.current
        return None if run is None or run.expected is None else (run.expected, dict(run.arithmetic))

    def _chains(self, layer: int | None) -> dict:
        """The chains inside the roles of a layer (None: the input and output), chains.py; kept per layer."""
        if layer not in self._chain_cache:
            self._chain_cache[layer] = global_chains(self.model) if layer is None else layer_chains(self.model, layer)
        return self._chain_cache[layer]

    def check(self, ev: Evaluation) -> list[SiteReport]:
        """One SiteReport per mapped layer (of --layer), holding the model's CheckResults; every printed node of
        the evaluation is counted, and those not compared are named with the reason (Summary.unchecked).

        Deferred (verify.py without an observer): the evaluation's printed samples are kept and its reports come
        when its run ends (the next run's first evaluation, or finish()), from a reference computed one layer at a
        time (memory flat in depth and prompt length: module work.py)."""
        out: list[SiteReport] = []
        if self.deferred and self.runs.current is not None and self.runs.current.index != ev.run:
            out += self._flush()
        roles = assign(ev)
        layers = map_evaluation(ev, roles, self._chains)
        why: dict[int, str] = {}
        if layers and ev.run not in self.without_ids:
            try:
                run = self.runs.of(ev, layers)
                require_model(self.model, ev, run.tokens, self.source)  # another model's dump is no build's fault
            except MissingIds as e:
                if self.require_ids:
                    raise
                if self.deferred:
                    out += self._flush()
                self.without_ids[ev.run] = e.message
                self.runs.finish(complete=False)  # what a run checked before its ids ran out stays reported
        if ev.run in self.without_ids:
            why = {id(n): "the run's token ids are unknown (the log prints none; pass them with --tokens)"
                   for n in ev.nodes}
            layers = []
        items = []
        for L in layers:
            if self.layers is not None and L.layer not in self.layers:
                for m in L.mapped:
                    why[id(m.node)] = "not of the --layer layers"
                continue
            light = work.light_layer(L)
            items.append((light, [it for m in L.mapped if (it := self._item(ev, light, m, why)) is not None]))
        self._ambiguous(ev, layers, why)
        for n in ev.nodes:  # no reference place found: say when the node reads one whose header was lost
            lost = [s.name for i, s in enumerate(n.srcs) if (n.lost >> i) & 1]
            if lost and id(n) not in why:
                at = ev.damaged_names.get(lost[0])
                why[id(n)] = f"reads '{lost[0]}', whose header was damaged" + (f" (line {at})" if at else "")
        self.work.add(ev, roles, why, items)
        if not self.deferred:
            out += self._flush(keep=True)
        return out

    @staticmethod
    def _ambiguous(ev: Evaluation, layers: list[Layer], why: dict[int, str]) -> None:
        """A layout copy (VIEW, PERMUTE, ...) next to a mapped node but not mapped itself: its axes could not be told
        apart (two of one length, e.g. D_h = n_kv = 256), so its elements cannot be placed: said so."""
        mapped = {id(m.node) for L in layers for m in L.mapped}
        feeds = {id(m.node.inputs[0]) for L in layers for m in L.mapped if m.node.op in LAYOUT}  # read by a copy
        for n in ev.nodes:
            if id(n) in why or id(n) in mapped or n.op not in LAYOUT or n.quantized:
                continue
            near = (n.inputs[0] is not None and id(n.inputs[0]) in mapped) or id(n) in feeds
            if near and len({x for x in n.ne[:3] if x > 1}) < len([x for x in n.ne[:3] if x > 1]):
                why[id(n)] = (f"a copy of a checked node whose axes cannot be told apart (two of length "
                              f"{max(x for x in n.ne[:3] if n.ne[:3].count(x) > 1)})")

    def _item(self, ev: Evaluation, L: Layer, m, why: dict[int, str]):
        """A mapped node to compare (work.Item), or None with why it has no check (in `why`)."""
        if m.node.cut:
            why[id(m.node)] = "the dump ends inside it"
            return None
        if m.node.line in ev.damaged and m.quantity == "rows":  # 2024 logs interleave stdout and stderr
            why[id(m.node)] = "does not print as its ne says (interleaved output?)"
            return None
        per_head = bool({"head", "kvhead"} & set(m.labels)) or ("col" in m.labels and m.quantity != "rows")
        if self.heads is not None and not per_head:
            why[id(m.node)] = "not of the --head heads"
            return None
        try:
            sample = parse_sample(m.node, self.source)
        except DumpError as e:
            if not interleaved(m.node):
                raise
            why[id(m.node)] = f"its print was broken by interleaved log lines (line {e.line}: {e.message})"
            return None
        why[id(m.node)] = "its ne does not fit the reference"  # until compared
        return work.item(m, sample, position_after_matmul(m.node))

    def _flush(self, keep: bool = False) -> list[SiteReport]:
        """Compare the kept work of the current run with its reference and return its SiteReports (keep: the run
        goes on, its reference is kept whole: the eager mode of inspect and the HTML page)."""
        run = self.runs.current
        if run is None or not self.work.evaluations:
            self.work.clear()
            return []
        results: dict[tuple[int, int], list[CheckResult]] = {}
        for exp, has in self.runs.parts(run, self.work, eager=keep):
            run.expected = exp
            for ev, L, it in self.work.items():
                if not has(it.m):
                    continue
                got = self._compare.check(ev.index, L, it.m, run, ev.n_past, L.T, it.sample, it.position)
                results.setdefault((ev.index, L.layer), []).extend(got)
                if got:
                    ev.why[it.line] = ""
            if not keep:  # one layer's reference at a time: not held while the next is computed
                del exp
                run.expected = None
        out = [self._site(ev, L, results.get((ev.index, L.layer), [])) for ev in self.work.evaluations
               for L in ev.layers]
        for ev in self.work.evaluations:
            self.summary.count(ev)
        self.work.clear()
        return out

    def _site(self, ev, L: Layer, results: list[CheckResult]) -> SiteReport:
        """The layer's SiteReport; verify.py merges it into the dump-only one where flash attention is off."""
        return SiteReport(
            evaluation=ev.index, run=ev.run, n_past=ev.n_past, T=L.T, layer=L.layer, H=L.H, H_kv=L.H_kv,
            D_h=L.D_h, n_kv=L.n_kv, kq_scale=float(self.model.hparams.kq_scale),
            nodes={"flash_attn" if L.flash else "kq_soft_max": L.anchor.name}, line=L.anchor.line, results=results,
            rows_whole=0, rows_printed=0)

    def _allowance(self) -> dict:
        """The cascade allowance of each run's regime (activations, KV class) by node class, for the JSON."""
        regimes = sorted({regime(self.activations, r["kv_type"], r.get("v_type") or r["kv_type"])
                          for r in self.runs.finished if r.get("kv_type")})
        return {"cascade": {"depth_bins": list(DEPTH), "regimes": {
                    f"{a}, {kv} cache": {cls: [list(x) for x in lim] for cls, lim in CASCADE[(a, kv)].items()}
                    for a, kv in regimes}},
                "nmse_max": {"derived": NMSE_MAX, "cascade": None}}  # cascade: reported, not a failure

    def finish(self, complete: bool = True) -> tuple[list[SiteReport], dict]:
        """No SiteReport is held back; and the JSON `model` block: the model, the error models, per-kind figures,
        the first divergent node.

        Ends the last run (complete: the dump was read to its end, so --tokens must match its queries)."""
        held = self._flush() if self.deferred else []
        self.runs.finish(complete)
        hp, s = self.model.hparams, self.summary
        return held, {
            "path": self.path,
            "arch": hp.arch,
            "hparams": {"n_layer": hp.n_layer, "n_embd": hp.n_embd, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv,
                        "head_dim": hp.head_dim, "kq_scale": hp.kq_scale, "n_vocab": hp.n_vocab},
            "runs": self.runs.finished + [{"run": r, "tokens": None, "tokens_from": None, "not_checked": why}
                                          for r, why in sorted(self.without_ids.items())],
            "error_models": ERROR_MODELS,
            "activations": self.activations, **self._allowance(),
            "nodes_printed": s.printed,
            "nodes_checked": s.checked,
            "unchecked": s.unchecked_list(),
            "coverage": s.coverage,
            "by_check": s.by_check(),
            "first_beyond_print": s.first(lambda n: n.beyond_print > 0),
            "first_failed": s.first(lambda n: not n.passed),
            "cascade_needed": s.cascade(),
        }
