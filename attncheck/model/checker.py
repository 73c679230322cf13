"""`--model`: every printed number of the attention (and of the layer around it) against a reference forward pass.

The checker of checker.py's interface for `--model`: per evaluation, map the printed nodes to reference quantities
(mapping.py), keep each run's reference (runs.py), compare node by node under the error model (compare.py,
bounds.py), and keep what the JSON reports (summary.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..dump.graph import Evaluation
from ..results import CheckResult, SiteReport
from .bounds import ERROR_MODELS, FLIP_SHARE, NMSE_MAX, TAU, regime
from .compare import NodeComparison
from .expect import Expected
from .identity import require_model
from .mapping import Layer, map_evaluation
from .runs import Runs
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
    model: Model = field(init=False)
    runs: Runs = field(init=False)
    summary: Summary = field(default_factory=Summary, init=False)
    activations: str = field(default="float", init=False)

    def __post_init__(self) -> None:
        self.model = load_model(self.path, self.header)
        first = "blk.0.attn_qkv.weight" if self.model.has("blk.0.attn_qkv.weight") else "blk.0.attn_q.weight"
        quantized = self.model.has(first) and self.model.tensor_type(first).name not in ("F32", "F16", "BF16")
        self.activations = "8-bit" if quantized else "float"
        if self.kq_scale is not None:
            self.model.hparams = replace(self.model.hparams, kq_scale=float(self.kq_scale))
        self.runs = Runs(self.model, self.source, self.tokens)
        self._compare = NodeComparison(self.source, self.activations, self.heads, self.summary)

    @property
    def current(self) -> tuple[Expected, dict] | None:
        """The reference of the run being checked, and the arithmetic chosen for it (inspect --model)."""
        run = self.runs.current
        return None if run is None or run.expected is None else (run.expected, dict(run.arithmetic))

    def check(self, ev: Evaluation) -> list[SiteReport]:
        """One SiteReport per mapped layer (of --layer), holding the model's CheckResults."""
        layers = map_evaluation(ev)
        if not layers:
            return []
        run = self.runs.of(ev, layers)
        require_model(self.model, ev, run.tokens, self.source)  # another model's dump is no build's fault
        n_past, T = ev.n_past or 0, layers[0].T
        out = []
        for L in layers:
            if self.layers is not None and L.layer not in self.layers:
                continue
            results: list[CheckResult] = []
            for m in L.mapped:
                if m.node.cut:
                    self.summary.skipped.append(f"{m.node.name} (line {m.node.line}): the dump ends inside it")
                    continue
                if m.node.line in ev.damaged and m.quantity == "rows":  # 2024 logs interleave stdout and stderr
                    self.summary.skipped.append(f"{m.node.name} (line {m.node.line}): does not print as its ne says "
                                                "(interleaved output?)")
                    continue
                per_head = bool({"head", "kvhead"} & set(m.labels)) or (m.labels[2] == "col" and m.quantity != "rows")
                if self.heads is not None and not per_head:
                    continue
                results.extend(self._compare.check(ev.index, L, m, run, n_past, T))
            out.append(self._site(ev, L, results))
        return out

    def _site(self, ev: Evaluation, L: Layer, results: list[CheckResult]) -> SiteReport:
        """The layer's SiteReport; verify.py merges it into the dump-only one where flash attention is off."""
        return SiteReport(
            evaluation=ev.index, run=ev.run, n_past=ev.n_past or 0, T=L.T, layer=L.layer, H=L.H, H_kv=L.H_kv,
            D_h=L.D_h, n_kv=L.n_kv, kq_scale=float(self.model.hparams.kq_scale),
            nodes={"flash_attn" if L.flash else "kq_soft_max": L.anchor.name}, line=L.anchor.line, results=results,
            rows_whole=0, rows_printed=0)

    def _allowance(self) -> dict:
        """The cascade allowance of each run's regime (activations, KV class) by node class, for the JSON."""
        regimes = sorted({regime(self.activations, r["kv_type"], r.get("v_type") or r["kv_type"])
                          for r in self.runs.finished if r.get("kv_type")})
        return {"tau": {f"{a}, {kv} cache": TAU[(a, kv)] for a, kv in regimes},
                "nmse_max": {"derived": NMSE_MAX, "cascade": None}}  # cascade: reported, not a failure

    def finish(self, complete: bool = True) -> tuple[list[SiteReport], dict]:
        """No SiteReport is held back; and the JSON `model` block: the model, the error models, per-kind figures,
        the first divergent node.

        Ends the last run (complete: the dump was read to its end, so --tokens must match its queries)."""
        self.runs.finish(complete)
        hp, s = self.model.hparams, self.summary
        return [], {
            "path": self.path,
            "arch": hp.arch,
            "hparams": {"n_layer": hp.n_layer, "n_embd": hp.n_embd, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv,
                        "head_dim": hp.head_dim, "kq_scale": hp.kq_scale, "n_vocab": hp.n_vocab},
            "runs": self.runs.finished,
            "error_models": ERROR_MODELS,
            "activations": self.activations, **self._allowance(),
            "flip_share": FLIP_SHARE,
            "nodes_checked": len(s.notes),
            "coverage": s.coverage,
            "by_check": s.by_check(),
            "first_beyond_print": s.first(lambda n: n.beyond_print > 0),
            "first_failed": s.first(lambda n: not n.passed),
            "cascade": s.cascade(),
            "skipped": s.skipped,
        }
