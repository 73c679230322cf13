"""Checks → report data: per-site results, coverage, verdict, exit code, and the JSON document (schema 1)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .arch.facts import AttentionFacts, Fact
from .results import SiteReport, Tolerance, json_number

SCHEMA = 1
EXIT_PASS, EXIT_FAIL, EXIT_INPUT, EXIT_UNVERIFIED = 0, 1, 2, 3
# checks that recompute nothing of attention: every printed number finite, and the SOFT_MAX `sum =` line (T·H). They
# fail a run, but a run of which only they were checked is not verified (exit 3), never a PASS
WEAK = ("finite", "sum")


@dataclass
class Report:
    source: str
    # the scale given before any run was read (verify.given_facts: --kq-scale, else the model's header, else
    # 1/sqrt(D_h)); each run's pinned one is in `facts`, and each site's value in its SiteReport
    kq_scale: Fact = AttentionFacts().kq_scale
    tolerance: Tolerance | None = None  # --atol/--rtol; None: the bounds derived per element (bounds.py)
    sites: list[SiteReport] = field(default_factory=list)
    evaluations: int = 0
    runs: int = 0
    tokens: list[tuple[int, ...] | None] = field(default_factory=list)  # per run; None: the log printed no ids
    token_text: list[list[str] | None] = field(default_factory=list)  # per run, with a model: each token's text
    flash_nodes: int = 0
    inferred_kq_scale: float | None = None
    inferred_rows: int = 0
    hint: str = ""
    warnings: list[str] = field(default_factory=list)
    layers_seen: set[int] = field(default_factory=set)  # layers with an attention site, checked or filtered out
    layer_kinds: dict[int, str] = field(default_factory=dict)  # every numbered layer: softmax, flash, recurrent, none
    other_softmax: list[str] = field(default_factory=list)  # SOFT_MAX nodes that are not attention (MoE routers)
    facts: list[dict] = field(default_factory=list)  # per run: the attention facts used and where each came from
    stopped_early: bool = False
    heads: frozenset[int] | None = None  # --head: the heads asked for (None: all)
    model: dict | None = None  # --model: the `model` block of model/checker.py's ModelChecker.finish()

    @property
    def checked(self) -> int:
        """Elements of the checks that recompute attention (WEAK ones alone verify nothing: see exit_code)."""
        return sum(r.checked for s in self.sites for r in s.results if r.check not in WEAK)

    @property
    def failed_sites(self) -> list[SiteReport]:
        return [s for s in self.sites if not s.passed]

    @property
    def exit_code(self) -> int:
        if self.failed_sites:
            return EXIT_FAIL
        if not self.sites or self.checked == 0:
            return EXIT_UNVERIFIED
        return EXIT_PASS

    @property
    def verdict(self) -> str:
        return {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_UNVERIFIED: "unverified"}[self.exit_code]

    def totals(self) -> dict[str, int]:
        t = lambda c: sum(s.checked(c) for s in self.sites)  # noqa: E731
        return {
            "sites": len(self.sites),
            "sites_failed": len(self.failed_sites),
            "softmax_rows_printed": sum(s.rows_printed for s in self.sites),
            "softmax_rows_checked": sum(s.rows_whole for s in self.sites),
            "softmax_elements_checked": t("softmax"),
            "softmax_ratio_elements_checked": t("softmax_ratio"),
            "masked_weights_checked": t("masked"),
            "kqv_elements_checked": t("pv"),
            "kqv_elements_unchecked": sum(r.unchecked for s in self.sites for r in s.results if r.check == "pv"),
            "sums_checked": t("sum"),
            "step_elements_checked": t("step"),
            **self._model_totals(),
        }

    def _model_totals(self) -> dict[str, int]:
        """--model: printed elements compared with the reference (printed = checked + unchecked, e.g. by --head)."""
        res = [r for s in self.sites for r in s.results if r.check.startswith("model_") and r.check != "model_sum"]
        kq = [r for r in res if r.check == "model_kq"]
        return {
            "model_nodes_checked": len(res),
            "model_elements_printed": sum(r.checked + r.unchecked for r in res),
            "model_elements_checked": sum(r.checked for r in res),
            "model_kq_elements_printed": sum(r.checked + r.unchecked for r in kq),
            "model_kq_elements_checked": sum(r.checked for r in kq),
            "model_sums_checked": sum(r.checked for s in self.sites for r in s.results if r.check == "model_sum"),
        }

    def kq_scale_fact(self) -> dict:
        """The SOFT_MAX scale as one fact (value, origin, detail), the one every run's facts hold; when runs differ,
        value None and each run's under "runs"."""
        per_run = [r["kq_scale"] for r in self.facts if "kq_scale" in r]
        if not per_run:  # no run pinned one: the scale given, the one the --model checks used
            return self.kq_scale.to_dict()
        if all(f == per_run[0] for f in per_run):
            return per_run[0]
        return {"value": None, "origin": "per run", "detail": "the runs' facts differ", "runs": per_run}

    def head_range(self) -> str:
        """The heads the checked layers have: '0..11' (or per count when layers differ)."""
        counts = sorted({s.H for s in self.sites})
        return " or ".join(f"0..{h - 1}" for h in counts)

    def absent_heads(self) -> list[int]:
        """--head values that no checked layer has (a usage error)."""
        if not self.heads or not self.sites:
            return []
        most = max(s.H for s in self.sites)
        return sorted(h for h in self.heads if h >= most)

    def layer_numbers(self) -> list[int]:
        """Every layer the dump has, with softmax attention or without."""
        return sorted(set(self.layer_kinds) | self.layers_seen)

    def absent_layers(self, asked: frozenset[int] | None) -> list[int]:
        """--layer values the dump has no layer for (a usage error); a layer without attention is not absent."""
        known = self.layer_numbers()
        return sorted(set(asked) - set(known)) if asked and known else []

    def unprinted_heads(self) -> tuple[list[int], list[int]]:
        """--head values llama.cpp printed in no checked layer, and the heads it did print (the first and last 3)."""
        from .dump.sample import printed_indices

        if not self.heads or not self.sites:
            return [], []
        printed = sorted({int(h) for s in self.sites for h in printed_indices(s.H)})
        return sorted(set(self.heads) - set(printed)), printed

    def unverified_reason(self) -> str:
        if self.flash_nodes and not self.sites:
            return (f"{self.flash_nodes} FLASH_ATTN_EXT nodes and no kq/kq_soft_max/kqv: flash attention prints no "
                    "scores or weights. Re-run llama.cpp with --flash-attn off to check attention from the dump alone, "
                    "or check it against the model with --model GGUF.")
        if not self.sites and self.layers_seen:
            return (f"no attention site in the layers asked for: the dump has layers "
                    f"{', '.join(map(str, sorted(self.layers_seen)))}")
        if not self.sites:
            return "no attention sites (no SOFT_MAX node) in this dump"
        missing, printed = self.unprinted_heads()
        if missing and set(missing) == set(self.heads):
            return (f"head{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} "
                    f"{'were' if len(missing) > 1 else 'was'} not printed: llama.cpp prints the first and last 3 "
                    f"heads, here {', '.join(map(str, printed))} of {self.head_range()}")
        return "attention sites were found, but none of their printed elements could be checked"

    def to_dict(self) -> dict:
        from . import __version__

        return {
            "schema": SCHEMA,
            "tool": "attncheck",
            "version": __version__,
            "source": self.source,
            "verdict": self.verdict,
            "exit_code": self.exit_code,
            "kq_scale": self.kq_scale_fact(),
            "inferred_kq_scale": {"value": self.inferred_kq_scale, "rows": self.inferred_rows},
            "tolerance": ({"origin": "derived per element from print precision and storage types"}
                          if self.tolerance is None else
                          {"origin": "--atol/--rtol", "atol": self.tolerance.atol, "rtol": self.tolerance.rtol}),
            "facts": self.facts,
            "layers": {str(k): v for k, v in sorted(self.layer_kinds.items())},
            "other_softmax": self.other_softmax,
            "hint": self.hint or None,
            "reason": self.unverified_reason() if self.exit_code == EXIT_UNVERIFIED else None,
            "runs": self.runs,
            "tokens": [None if t is None else list(t) for t in self.tokens],
            "token_text": self.token_text or None,
            "evaluations": self.evaluations,
            "flash_attention_nodes": self.flash_nodes,
            "stopped_early": self.stopped_early,
            "heads": None if self.heads is None else {"asked": sorted(self.heads),
                                                      "not_printed": self.unprinted_heads()[0]},
            "totals": self.totals(),
            "sites": [_site_dict(s) for s in self.sites],
            "warnings": self.warnings,
            "model": self.model,
        }


def multi_dict(reports: list[Report], inputs: list[tuple[str, int, str | None]], left: list[str]) -> dict:
    """Several dumps: each one's document, the overall verdict and exit code, the unusable inputs with their error
    line, and the dumps --fail-fast left unchecked."""
    from . import __version__

    codes = [code for _, code, _ in inputs]
    code = next((c for c in (EXIT_FAIL, EXIT_INPUT, EXIT_UNVERIFIED) if c in codes), EXIT_PASS)
    return {
        "schema": SCHEMA, "tool": "attncheck", "version": __version__,
        "verdict": {EXIT_PASS: "pass", EXIT_FAIL: "fail", EXIT_INPUT: "error", EXIT_UNVERIFIED: "unverified"}[code],
        "exit_code": code,
        "stopped_early": bool(left) or any(r.stopped_early for r in reports),
        "not_checked": left,
        "errors": [{"source": path, "error": error} for path, _, error in inputs if error is not None],
        "dumps": [r.to_dict() for r in reports],
    }


def _loc(at) -> dict | None:
    return None if at is None else {k: v for k, v in at._asdict().items() if v is not None}



def _site_dict(s: SiteReport) -> dict:
    return {
        "evaluation": s.evaluation, "run": s.run, "n_past": s.n_past, "T": s.T, "layer": s.layer,
        "H": s.H, "H_kv": s.H_kv, "D_h": s.D_h, "n_kv": s.n_kv, "kq_scale": s.kq_scale,
        "nodes": s.nodes, "line": s.line, "passed": s.passed, "facts": s.facts,
        "softmax_rows": {"printed": s.rows_printed, "checked": s.rows_whole},
        "checks": [
            {
                "check": r.check, "node": r.node, "line": r.line, "passed": r.passed,
                "checked": r.checked, "unchecked": r.unchecked, "why_unchecked": r.why_unchecked or None,
                "max_error": json_number(r.max_error), "bound": json_number(r.bound),
                "ratio": json_number(r.ratio),
                "worst": _loc(r.worst), "failed": r.failed, "note": r.note or None,
                "nmse": None if r.nmse is None else json_number(r.nmse), "error_model": r.error_model,
                "failures": [{"at": _loc(f.at), "got": json_number(f.got), "want": json_number(f.want),
                              "bound": json_number(f.bound), "line": f.line}
                             for f in r.failures],
            }
            for r in s.results
        ],
    }
