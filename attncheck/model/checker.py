"""`--model`: every printed number of the attention (and of the layer around it) against a reference forward pass.

A dump alone cannot check k·q (it needs all D_h components of q and k) nor a query whose visible slots were not
printed. The GGUF weights and the token ids give everything back: reference.py recomputes every node of the run, and
each printed element of each node that model_roles.py maps (Qcur and q, Kcur, Vcur, the K/V cache views and stores,
kq, kq_soft_max, kqv or FLASH_ATTN_EXT, kqv_out, attn_norm, attn_out, ffn_inp, ffn_norm, ffn_out, l_out,
inp_embd, result_norm, result_output) is compared with it at positions [n_past, n_past + T); slots at or past
n_past + T of a cache view, kq or kq_soft_max are empty and must print 0. So are the full-tensor `sum =` lines.

Error model (per node, the JSON says which applied; terms in model_expect.py):

- always, per element: 5e-5 (the `%12.4f` print) + 2^-20·|ref| (the last f32 rounding).
- "derived": layer 0's attention (q, Kcur, Vcur, the cache views, kq, kq_soft_max, kqv, kqv_out), inp_embd and
  attn_norm, whose inputs llama.cpp and the reference share up to f32 noise. Adds the f32 summation noise,
  (n/8 + 4)·2^-24·Σ|terms| of each dot product and its effect downstream, and the rounding flips (q and P rounded
  to the KV cache type before the two MUL_MATs, K and V stored rounded). Flips are rare: at most 10 % of a node's
  printed elements may use that allowance (measured: 3 of 108 in the shipped dumps); beyond that it is withdrawn
  and they fail (a wrong cache type makes 33-74 %). NMSE <= 5e-4, test-backend-ops' bound for one MUL_MAT.
- "cascade": everything after layer 0's attention. A flip changes a value that later conversions round again (the
  next weight MUL_MAT's input quantized to Q8_0 blocks or rounded to f16, q and P rounded), so disagreements grow
  with depth and prompt length. Allowance TAU·rms(ref), rms over the printed elements that hold values (not empty
  cache slots), TAU by the weights' activation conversion: 0.3 for quantized weights (8-bit activations), 0.1 for
  float weights; NMSE <= 5e-3. Measured with the real llama-eval-callback (the shipped dumps; 30 runs of gpt2-mini
  and llama-mini over 13-170 token prompts, flash attention on and off, -ub 5 and 16, f32 caches; random 12- and
  48-layer models made the same way): worst TAU needed 0.18 (12-layer Q8_0 gpt2, -ub 4, layer 9) and 0.036
  (12-layer f16 llama), worst NMSE 2e-3 (48-layer Q8_0, layer 46) — above test-backend-ops' 5e-4, which assumes
  identical inputs. This bound is honest, not tight: in those layers a single score of kq (rms ≈ 11 for the
  GPT-2-sized model) can move by 3, a weight of kq_soft_max by 0.1 unnoticed by these checks (the dump-only checks
  still tie kq, kq_soft_max and kqv of one layer to each other); layer 0 is held at print precision.
- "+flash": FLASH_ATTN_EXT adds its kernel's arithmetic (f16 accumulation of P·V, P not rounded, f32 q in the tiled
  kernel), in every layer.
- sums: the f32 accumulation of the printed `sum` (n·2^-24·Σ|x| + 5e-7) plus, derived, every element's allowance,
  or, cascade, sqrt(n·5e-3·Σref²) (the NMSE bound through Cauchy-Schwarz). Dumps from before llama.cpp PR #15637
  summed the printed values only; which meaning a run uses is decided by the first derived node whose tight bound
  tells them apart.
- the arithmetic of the build: an f16 src0 multiplies a contiguous f32 src1 converted to f16 (today) or as f32
  (2024 builds with llamafile's tinyBLAS); both are correct, they differ by ~1e-3 in layer 0, and the reference uses
  the one that fits layer 0's q and kqv (reference.F16_SRC1; the JSON says which).

Every element beyond its bound fails with its node, layer, head, query (and token position), slot or dim; NMSE is
reported per node and fails a node on its own (one moved element fails by its bound long before NMSE notices it).
The summary names the first node, in graph order, that leaves print precision, and the first that fails.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from ..check import bounds
from ..check.checks import CheckResult, Failure, Location, compare
from ..errors import DumpError
from ..dump.graph import Evaluation
from .weights import Model, ModelError, load_model
from .expect import Expected
from .mapping import CANONICAL, Layer, Mapped, arrange, map_evaluation
from .reference import KV_TYPES, forward
from ..check.report import SiteReport
from ..dump.sample import parse_sample

PRINT = bounds.PRINT
F32_REL = 2.0**-20
# cascade allowance, by what a weight MUL_MAT does to its input: quantized to 8-bit blocks (Q8_0/Q8_K, for
# quantized weights) or rounded to f16/bf16 (float weights); see the module doc for the measurements
TAU = {"8-bit": 0.3, "float": 0.1}
NMSE_MAX = 5e-4  # test-backend-ops' MUL_MAT bound: one op, identical inputs (the derived model)
NMSE_CASCADE = 5e-3  # measured worst 2e-3 on correct runs (a 48-layer Q8_0 model)
FLIP_SHARE = 0.10

DERIVED = ("q", "Kcur", "Vcur", "k", "v", "kq", "kq_soft_max", "kqv")  # quantities held to the layer-0 bound
DERIVED_ROWS = ("inp_embd", "attn_norm")
CHECK = {"q": "model_q", "Kcur": "model_kcur", "Vcur": "model_vcur", "k": "model_k", "v": "model_v",
         "kq": "model_kq", "kq_soft_max": "model_softmax", "kqv": "model_kqv"}
ERROR_MODELS = {
    "derived": "5e-5 + 2^-20|ref| + f32 summation noise + layer-0 rounding flips (q, P to the KV type; K, V "
               "stored) for at most 10% of the printed elements; NMSE <= 5e-4",
    "cascade": "5e-5 + 2^-20|ref| + TAU·rms(ref over the printed values), TAU 0.3 (quantized weights) or 0.1 (float "
               "weights); NMSE <= 5e-3",
    "derived+flash": "derived, plus the flash-attention kernel's f16 accumulation and unrounded P",
    "cascade+flash": "cascade, plus the flash-attention kernel's f16 accumulation and unrounded P",
}


def check_name(m: Mapped) -> str:
    if m.role == "flash_attn":
        return "model_flash_attn"
    if m.role == "kqv_out":
        return "model_kqv_out"
    return CHECK.get(m.quantity, f"model_{m.role}")


def parse_tokens(text: str | None) -> tuple[int, ...] | None:
    """`--tokens 1,2,3` → (1, 2, 3); spaces allowed. ValueError names what is not a token id."""
    if text is None:
        return None
    parts = [p for p in text.replace(" ", ",").split(",") if p]
    try:
        ids = tuple(int(p) for p in parts)
    except ValueError:
        raise ValueError(f"--tokens takes comma-separated token ids, not {text!r}") from None
    if not ids or min(ids) < 0:
        raise ValueError(f"--tokens takes comma-separated token ids >= 0, not {text!r}")
    return ids


@dataclass
class _Run:
    index: int
    tokens: tuple[int, ...]
    origin: str  # "log" | "--tokens"
    expected: Expected | None = None
    T_seen: int = 0
    line: int = 0
    arithmetic: dict = field(default_factory=dict)
    sum_mode: str | None = None  # what `sum =` adds up, once a layer-0 node's tight bound told it


@dataclass
class _NodeNote:
    """What the summary keeps per checked node (graph order = evaluation, then line)."""

    evaluation: int
    layer: int
    node: str
    line: int
    check: str
    error_model: str
    max_error: float
    nmse: float
    beyond_print: int
    passed: bool


@dataclass
class ModelChecker:
    """Checks evaluations against the reference of a GGUF model; one per dump (verify.py drives it)."""

    path: str
    source: str
    kq_scale: float | None = None
    tokens: tuple[int, ...] | None = None
    layers: frozenset[int] | None = None
    heads: frozenset[int] | None = None
    model: Model = field(init=False)
    _run: _Run | None = field(default=None, init=False)
    _runs: list[dict] = field(default_factory=list, init=False)
    _notes: list[_NodeNote] = field(default_factory=list, init=False)
    _skipped: list[str] = field(default_factory=list, init=False)
    _coverage: dict[str, dict[str, int]] = field(default_factory=dict, init=False)
    activations: str = field(default="float", init=False)
    tau: float = field(default=0.1, init=False)

    def __post_init__(self) -> None:
        self.model = load_model(self.path)
        first = "blk.0.attn_qkv.weight" if self.model.has("blk.0.attn_qkv.weight") else "blk.0.attn_q.weight"
        quantized = self.model.has(first) and self.model.tensor_type(first).name not in ("F32", "F16", "BF16")
        self.activations = "8-bit" if quantized else "float"
        self.tau = TAU[self.activations]
        if self.kq_scale is not None:
            self.model.hparams = replace(self.model.hparams, kq_scale=float(self.kq_scale))

    # ---- runs and tokens ------------------------------------------------------------------------------------

    def _start_run(self, ev: Evaluation, layers: list[Layer]) -> _Run:
        self.finish()
        line = layers[0].anchor.line
        given, logged = self.tokens, ev.tokens
        if logged is not None and len(logged) == 0:
            logged = None
        if logged is None and given is None:
            raise DumpError(self.source, line, "the log holds no token ids (llama.cpp before the `number of input "
                                               "tokens` lines); pass them with --tokens 1,2,3")
        if logged is not None and given is not None and tuple(given) != tuple(logged):
            raise DumpError(self.source, line, f"--tokens {','.join(map(str, given))} differ from the token ids "
                                               f"the log printed ({','.join(map(str, logged))})")
        tokens, origin = (logged, "log") if logged is not None else (given, "--tokens")
        run = _Run(ev.run, tuple(tokens), origin, line=line)  # type: ignore[arg-type]
        self._check_count(run, ev, layers)
        self._check_shapes(layers)
        kv = layers[0].kv_type or "f16"
        if kv not in KV_TYPES:
            raise DumpError(self.source, line, f"the KV cache is {kv}: --model emulates {', '.join(KV_TYPES)} caches "
                                               "only")
        run.expected = self._calibrated(ev, layers, run, kv, line)
        self._run = run
        return run

    def _reference(self, tokens: tuple[int, ...], kv: str, f16_src1: str, line: int) -> Expected:
        try:
            return Expected(forward(self.model, tokens, kv_type=kv, f16_src1=f16_src1), kv, self.model)
        except ValueError as e:
            raise DumpError(self.source, line, f"the tokens do not fit the model {self.path}: {e}") from None

    def _calibrated(self, ev: Evaluation, layers: list[Layer], run: _Run, kv: str, line: int) -> Expected:
        """The reference in the arithmetic this llama.cpp build used (reference.F16_SRC1), chosen on layer 0.

        An f16 src0 (F16 weights, an f16 V cache) multiplies a contiguous f32 src1 either converted to f16 (today)
        or as f32 (2024 builds with llamafile's tinyBLAS). Both are correct llama.cpp; they differ by ~1e-3 in
        layer 0's Qcur, which layer 0's bound must not absorb. The one whose layer-0 q and kqv fit print precision
        (all but the rare flips) is used, and the JSON says which.
        """
        exp = self._reference(run.tokens, kv, "convert", line)
        run.arithmetic = {"f16_src1": "convert"}
        first = next((L for L in layers if L.mapped and L.mapped[0].ref_layer == 0), None)
        if first is None:
            return exp
        beyond, n = self._misfit(first, exp, ev.n_past or 0)
        if n == 0 or beyond <= FLIP_SHARE * n:
            return exp
        alt = self._reference(run.tokens, kv, "f32", line)
        beyond_alt, _ = self._misfit(first, alt, ev.n_past or 0)
        run.arithmetic = {"f16_src1": "convert", "layer0_beyond_print": {"convert": beyond, "f32": beyond_alt},
                          "of": n}
        if beyond_alt < beyond:
            run.arithmetic["f16_src1"] = "f32"
            return alt
        return exp

    def _misfit(self, L: Layer, exp: Expected, n_past: int) -> tuple[int, int]:
        """Layer 0's printed q and kqv elements beyond print precision (5e-5 + 2^-20|ref|), and how many there are."""
        beyond = total = 0
        for m in L.mapped:
            if m.quantity not in ("q", "kqv") or L.flash or m.node.cut:
                continue
            full = arrange(exp.value(m.quantity, m.role, 0), CANONICAL[m.quantity], m.labels, m.node, n_past, L.T)
            if full is None:
                continue
            s = parse_sample(m.node, self.source)
            want = full[np.ix_(*s.index[1:])]
            with np.errstate(invalid="ignore"):
                beyond += int(np.count_nonzero(~(np.abs(s.values[0] - want) <= PRINT + F32_REL * np.abs(want))))
            total += want.size
        return beyond, total

    def _check_count(self, run: _Run, ev: Evaluation, layers: list[Layer]) -> None:
        """The run's token ids must cover this evaluation's queries, positions n_past .. n_past + T - 1."""
        T, n_past = layers[0].T, ev.n_past
        if n_past is None:
            raise DumpError(self.source, layers[0].anchor.line, "cannot place this evaluation: an earlier one had "
                                                                "no attention to count T")
        if n_past + T > len(run.tokens):
            said = "--tokens gives" if run.origin == "--tokens" else "the log printed"
            raise DumpError(self.source, layers[0].anchor.line,
                            f"{said} {len(run.tokens)} token ids, but this evaluation holds queries at positions "
                            f"{n_past}..{n_past + T - 1}")

    def finish(self, complete: bool = True) -> None:
        """The end of a run: --tokens must have given exactly its tokens (unless checking stopped early)."""
        run = self._run
        if run is None:
            return
        self._runs.append({"run": run.index, "tokens": list(run.tokens), "tokens_from": run.origin,
                           "kv_type": run.expected.kv_type if run.expected else None, "queries_seen": run.T_seen,
                           "arithmetic": run.arithmetic, "sums_of": run.sum_mode})
        self._run = None
        if complete and run.origin == "--tokens" and run.T_seen != len(run.tokens):
            raise DumpError(self.source, run.line, f"--tokens gives {len(run.tokens)} token ids, but the run's "
                                                   f"evaluations hold {run.T_seen} queries")

    def _check_shapes(self, layers: list[Layer]) -> None:
        hp = self.model.hparams
        for L in layers:
            got = (L.H, L.H_kv, L.D_h)
            want = (hp.n_head, hp.n_head_kv, hp.head_dim)
            if got != want or L.layer >= hp.n_layer:
                raise DumpError(self.source, L.anchor.line,
                                f"the model does not fit this dump: layer {L.layer} has {L.H} query heads, {L.H_kv} KV "
                                f"heads of D_h = {L.D_h}; {self.path} ({hp.arch}) has {hp.n_layer} layers, "
                                f"{hp.n_head} query heads, {hp.n_head_kv} KV heads of D_h = {hp.head_dim}")
            for m in L.mapped:
                if m.quantity == "rows":
                    width = hp.n_vocab if m.role == "result_output" else hp.n_embd
                    if m.node.ne[0] != width:
                        raise DumpError(self.source, m.node.line,
                                        f"the model does not fit this dump: '{m.node.name}' ({m.role}) is "
                                        f"{m.node.ne[0]} wide; {self.path} ({hp.arch}) gives {width}")

    @property
    def current(self) -> tuple[Expected, dict] | None:
        """The reference of the run being checked, and the arithmetic chosen for it (inspect --model)."""
        run = self._run
        return None if run is None or run.expected is None else (run.expected, dict(run.arithmetic))

    # ---- one evaluation -------------------------------------------------------------------------------------

    def check(self, ev: Evaluation) -> tuple[dict[int, list[CheckResult]], list[Layer]]:
        """The model's CheckResults of one evaluation, by layer; and the layers mapped (for flash site reports)."""
        layers = map_evaluation(ev)
        if not layers:
            return {}, layers
        run = self._run if self._run is not None and self._run.index == ev.run else self._start_run(ev, layers)
        self._check_shapes(layers)
        T = layers[0].T
        n_past = ev.n_past
        self._check_count(run, ev, layers)
        run.T_seen = n_past + T
        out: dict[int, list[CheckResult]] = {}
        for L in layers:
            if self.layers is not None and L.layer not in self.layers:
                continue
            results: list[CheckResult] = []
            for m in L.mapped:
                if m.node.cut:
                    self._skipped.append(f"{m.node.name} (line {m.node.line}): the dump ends inside it")
                    continue
                per_head = bool({"head", "kvhead"} & set(m.labels)) or (m.labels[2] == "col" and m.quantity != "rows")
                if self.heads is not None and not per_head:
                    continue
                results.extend(self._node(ev, L, m, run.expected, n_past, T))  # type: ignore[arg-type]
            out[L.layer] = results
        return out, layers

    def flash_sites(self, ev: Evaluation, layers: list[Layer], results: dict[int, list[CheckResult]]) -> list[SiteReport]:
        """SiteReports for FLASH_ATTN_EXT layers, which verify() has no dump-only site for."""
        out = []
        for L in layers:
            if not L.flash or L.layer not in results:
                continue
            out.append(SiteReport(
                evaluation=ev.index, run=ev.run, n_past=ev.n_past or 0, T=L.T, layer=L.layer, H=L.H, H_kv=L.H_kv,
                D_h=L.D_h, n_kv=L.n_kv, kq_scale=float(self.model.hparams.kq_scale),
                nodes={"flash_attn": L.anchor.name}, line=L.anchor.line, results=results.pop(L.layer),
                rows_whole=0, rows_printed=0))
        return out

    # ---- one node -------------------------------------------------------------------------------------------

    def _node(self, ev: Evaluation, L: Layer, m: Mapped, exp: Expected, n_past: int, T: int) -> list[CheckResult]:
        node = m.node
        ref_layer = m.ref_layer
        flash = L.flash and m.quantity == "kqv"
        derived = (ref_layer == 0 and m.quantity in DERIVED) or (m.role in DERIVED_ROWS and ref_layer in (0, None))
        model = ("derived" if derived else "cascade") + ("+flash" if flash else "")
        canon = CANONICAL[m.quantity]
        ref = exp.value(m.quantity, m.role, ref_layer)
        full = arrange(ref, canon, m.labels, node, n_past, T)
        if full is None:
            self._skipped.append(f"{node.name} (line {node.line}): its ne does not fit the reference")
            return []
        extra = np.zeros(full.shape)  # allowances every element may use (not rare flips)
        if flash:
            extra += arrange(exp.flash(ref_layer), CANONICAL["kqv"], m.labels, node, n_past, T)  # type: ignore
        if derived and ref_layer == 0:
            noise = exp.noise(m.quantity)
            if noise is not None:
                extra += arrange(noise, canon, m.labels, node, n_past, T)  # type: ignore[operator]
        flips = None
        if derived:
            f = exp.flips(m.quantity, flash) if ref_layer == 0 else None
            if f is not None:
                flips = arrange(f, canon, m.labels, node, n_past, T)
        valid = arrange(np.ones(ref.shape), canon, m.labels, node, n_past, T)

        s = parse_sample(node, self.source)
        ix = np.ix_(*s.index[1:])
        got_all = s.values[0]
        keep = self._head_mask(m, s, L)
        got, want = got_all[keep], full[ix][keep]
        base = PRINT + F32_REL * np.abs(want) + extra[ix][keep]
        err = np.abs(got - want)
        note = ""
        with np.errstate(invalid="ignore"):
            beyond = int(np.count_nonzero(~(err <= base)))
        if derived:
            allowed = math.ceil(FLIP_SHARE * len(got))
            bound = base
            if flips is not None:
                if beyond <= allowed:
                    bound = base + flips[ix][keep]
                else:
                    note = (f"{beyond} of {len(got)} printed elements are beyond print precision; rounding flips "
                            f"explain at most {allowed}, so none is allowed")
        else:
            live = want[valid[ix][keep] > 0]  # not the empty cache slots: they hold no value of the tensor
            rms = float(np.sqrt(np.mean(live**2))) if len(live) else 0.0
            bound = base + self.tau * rms
        if m.role in ("kq", "kq_soft_max", "flash_attn") and m.quantity in ("kq", "kq_soft_max", "kqv"):
            self._cover(m.role, got_all.shape, keep, m.labels)
        idx = np.nonzero(keep)
        res = compare(check_name(m), node, got, want, bound, self._locator(m, s, idx, L, n_past, T), note=note)
        res.error_model = model
        if len(got) < got_all.size:
            res.unchecked, res.why_unchecked = got_all.size - len(got), "not of the --head heads"
        with np.errstate(invalid="ignore", over="ignore"):
            den = float(np.sum(want**2))
            num = float(np.sum(err**2))
        res.nmse = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        nmse_max = NMSE_MAX if derived else NMSE_CASCADE
        if not res.nmse <= nmse_max:
            res.failed += 1
            res.failures.append(Failure(None, res.nmse, 0.0, nmse_max))
            res.note = (res.note + "; " if res.note else "") + f"NMSE {res.nmse:.2e} > {nmse_max:g}"
        self._notes.append(_NodeNote(ev.index, L.layer, node.name, node.line, res.check, model, res.max_error,
                                     res.nmse, beyond, res.passed))
        out = [res]
        if self.heads is None:
            out.append(self._sum(node, s, full, ix, bound, base, extra, flips, valid, derived, model))
        return out

    def _cover(self, role: str, shape: tuple[int, ...], keep: np.ndarray, labels: tuple[str, str, str]) -> None:
        """Count printed elements and query rows (head × query) of kq, kq_soft_max and FLASH_ATTN_EXT checked."""
        c = self._coverage.setdefault(role, {"elements_printed": 0, "elements_checked": 0, "query_rows_printed": 0,
                                             "query_rows_checked": 0})
        last = 2 if labels[2] in ("slot", "dim") else 1  # the axis along a row
        rows = keep.all(axis=last)
        c["elements_printed"] += int(np.prod(shape))
        c["elements_checked"] += int(keep.sum())
        c["query_rows_printed"] += rows.size
        c["query_rows_checked"] += int(rows.sum())

    def _head_mask(self, m: Mapped, s, L: Layer) -> np.ndarray:
        """[p2, p1, p0] printed elements to compare: all, or those of the --head heads (and the KV heads they read)."""
        shape = s.values.shape[1:]
        if self.heads is None:
            return np.ones(shape, bool)
        group = L.H // L.H_kv
        kv_heads = {h // group for h in self.heads}
        keep = np.ones(shape, bool)
        for axis, label in enumerate(m.labels):
            logical = s.index[1 + axis]
            if label == "head":
                sel = np.isin(logical, sorted(self.heads))
            elif label == "kvhead":
                sel = np.isin(logical, sorted(kv_heads))
            elif label == "col":
                per = m.quantity in ("k", "v", "Kcur", "Vcur")
                sel = np.isin(logical // L.D_h, sorted(kv_heads if per else self.heads))
            else:
                continue
            keep &= sel.reshape([-1 if a == axis else 1 for a in range(3)])
        return keep

    def _locator(self, m: Mapped, s, idx, L: Layer, n_past: int, T: int):
        """Element i of the compared (flattened) elements → its Location."""
        logical = [s.index[1 + a][idx[a]] for a in range(3)]
        n_rows = m.node.ne[1]

        def where(i: int) -> Location:
            at: dict[str, int | None] = {"head": None, "query": None, "slot": None, "dim": None, "pos": None}
            for label, values in zip(m.labels, logical):
                v = int(values[i])
                if label in ("head", "kvhead"):
                    at["head"] = v
                elif label == "query":
                    at["query"] = v
                elif label == "row":
                    at["query"] = T - n_rows + v
                elif label == "slot":
                    at["slot"] = v
                elif label == "dim":
                    at["dim"] = v
                elif label == "col":
                    if m.quantity == "rows":
                        at["dim"] = v
                    else:
                        at["head"], at["dim"] = divmod(v, L.D_h)
            if at["query"] is not None:
                at["pos"] = n_past + at["query"]
            elif at["slot"] is not None:
                at["pos"] = at["slot"]
            return Location(**at)

        return where

    def _sum(self, node, s, full, ix, bound, base, extra, flips, valid, derived, model) -> CheckResult:
        """The `sum =` line: the whole tensor today, the printed values only before llama.cpp PR #15637."""
        got = s.sums[0]
        n_valid = int(np.count_nonzero(valid))
        mag = float(np.abs(full).sum())
        want = float(full.sum())
        own = F32_REL * mag + float(extra.sum())
        if derived:
            own += float(flips.sum()) if flips is not None else 0.0
        else:
            own += math.sqrt(n_valid * NMSE_CASCADE * float(np.sum(full**2)))
        b_full = own + bounds.sum_bound(n_valid, mag)
        where = lambda i: None  # noqa: E731  (a whole-tensor value has no element)
        res = compare("model_sum", node, [got], [want], [b_full], where, note="full tensor")
        printed = full[ix]
        if printed.size != full.size:  # elided: the two meanings of `sum` differ
            p_want = float(printed.sum())
            p_bound = float(np.sum(bound)) + bounds.sum_bound(printed.size, float(np.abs(printed).sum()))
            alt = compare("model_sum", node, [got], [p_want], [p_bound], where,
                          note="printed values only (llama.cpp before PR #15637 summed what it printed)")
            run = self._run
            if run.sum_mode is None and derived and res.passed != alt.passed:  # a tight bound tells them apart
                run.sum_mode = "full tensor" if res.passed else "printed values"
            if run.sum_mode == "printed values" or (run.sum_mode is None and alt.ratio < res.ratio):
                res = alt
        res.error_model = model
        res.worst = None
        return res

    # ---- summary --------------------------------------------------------------------------------------------

    def summary(self, complete: bool = True) -> dict:
        """The JSON `model` block: the model, the error models, per-kind figures, the first divergent node.

        Ends the last run (complete: the dump was read to its end, so --tokens must match its queries)."""
        self.finish(complete)
        hp = self.model.hparams
        ordered = sorted(self._notes, key=lambda n: (n.evaluation, n.line))

        def first(pred) -> dict | None:
            n = next((x for x in ordered if pred(x)), None)
            return None if n is None else {
                "evaluation": n.evaluation, "layer": n.layer, "node": n.node, "line": n.line, "check": n.check,
                "max_error": _num(n.max_error), "nmse": _num(n.nmse), "beyond_print": n.beyond_print}

        kinds: dict[str, dict] = {}
        for n in self._notes:
            k = kinds.setdefault(n.check, {"nodes": 0, "max_error": 0.0, "max_nmse": 0.0, "failed": 0})
            k["nodes"] += 1
            k["max_error"] = max(k["max_error"], n.max_error)
            k["max_nmse"] = max(k["max_nmse"], n.nmse)
            k["failed"] += not n.passed
        return {
            "path": self.path,
            "arch": hp.arch,
            "hparams": {"n_layer": hp.n_layer, "n_embd": hp.n_embd, "n_head": hp.n_head, "n_head_kv": hp.n_head_kv,
                        "head_dim": hp.head_dim, "kq_scale": hp.kq_scale, "n_vocab": hp.n_vocab},
            "runs": self._runs,
            "error_models": ERROR_MODELS,
            "tau": self.tau, "activations": self.activations, "nmse_max": {"derived": NMSE_MAX, "cascade": NMSE_CASCADE},
            "flip_share": FLIP_SHARE,
            "nodes_checked": len(self._notes),
            "coverage": self._coverage,
            "by_check": {k: {**v, "max_error": _num(v["max_error"]), "max_nmse": _num(v["max_nmse"])}
                         for k, v in sorted(kinds.items())},
            "first_beyond_print": first(lambda n: n.beyond_print > 0),
            "first_failed": first(lambda n: not n.passed),
            "skipped": self._skipped,
        }


def _num(x: float):
    """JSON has no inf/nan: write them as strings."""
    return x if x == x and abs(x) != float("inf") else str(x)


__all__ = ["ModelChecker", "ModelError", "ERROR_MODELS", "parse_tokens", "TAU", "NMSE_MAX", "NMSE_CASCADE",
           "FLIP_SHARE"]
