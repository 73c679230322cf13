"""Run bookkeeping for `--model`: each llama.cpp run's token ids, its reference forward pass in the arithmetic of
the build that made the dump (chosen on layer 0), and what the JSON keeps of it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from ..dump.graph import Evaluation
from ..dump.sample import parse_sample
from ..errors import DumpError
from ..results import abs_error, within
from .bounds import F32_REL, MISFIT_SHARE, PRINT
from .expect import Expected
from .grid import locate
from .heap import give_back
from .mapping import CANONICAL, Layer
from . import flash
from .numerics import KV_TYPES
from .reference import forward, forward_layers
from .token_ids import recover
from .weights import Model

EMBEDDINGS = "embeddings"  # Run.origin of ids looked up in the model's embedding table
INPUT_ROLES = ("inp_embd", "inp_pos")  # the nodes before layer 0 (the others outside layers follow the last)


class MissingIds(DumpError):
    """A run whose token ids the log does not print and the model's embeddings cannot give (--tokens gives them)."""


def _spans(positions: list[int]) -> str:
    """[3, 4, 5, 7] → "3..5, 7"."""
    out: list[str] = []
    for p in positions:
        if out and out[-1].split("..")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('..')[0]}..{p}"
        else:
            out.append(str(p))
    return ", ".join(out)


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
class Run:
    """One llama.cpp run being checked: its tokens, where they came from, its reference, what it has seen."""

    index: int
    tokens: tuple[int, ...]
    origin: str  # "log" | "--tokens" | "embeddings" (looked up from the printed embedding rows: token_ids.py)
    expected: Expected | None = None
    T_seen: int = 0
    line: int = 0
    arithmetic: dict = field(default_factory=dict)
    kv: tuple[str, str] = ("f16", "f16")  # the K and V cache types
    rotates: bool = True  # the build rotates q, K (and V) before a quantized cache (2024's printed no rotation)
    probe: list = field(default_factory=list)  # layer 0's q, kq and kqv (Mapped, Sample, n_past, T): the arithmetic's
    sum_mode: str | None = None  # what `sum =` adds up, once a layer-0 node's tight bound told it
    flash: list[tuple[int, int]] = field(default_factory=list)  # (n_past, T) of the evaluations with flash attention
    spans: list[tuple[int, int]] = field(default_factory=list)  # (n_past, T) of every evaluation
    today: bool = True  # the build writes the cache with SET_ROWS (today's); 2024's CPY (flash.py: its kernels)


@dataclass
class Runs:
    """The run being checked and those finished; a new run starts the reference over."""

    model: Model
    source: str
    tokens: tuple[int, ...] | None  # --tokens
    deferred: bool = False  # ModelChecker.deferred
    current: Run | None = None
    finished: list[dict] = field(default_factory=list)

    def of(self, ev: Evaluation, layers: list[Layer]) -> Run:
        """The run this evaluation belongs to: the current one, or a new one started on it."""
        run = self.current
        if run is None or run.index != ev.run:
            run = self.start(ev, layers)
        elif run.origin == EMBEDDINGS and (ev.n_past or 0) + layers[0].T > len(run.tokens):
            self._extend(run, ev, layers)
        self.check_shapes(layers)
        self.check_count(run, ev, layers)
        run.T_seen = (ev.n_past or 0) + layers[0].T
        if layers[0].flash and (ev.n_past or 0, layers[0].T) not in run.flash:
            run.flash.append((ev.n_past or 0, layers[0].T))
        if (ev.n_past or 0, layers[0].T) not in run.spans:
            run.spans.append((ev.n_past or 0, layers[0].T))
        return run

    def start(self, ev: Evaluation, layers: list[Layer]) -> Run:
        self.finish()
        line = layers[0].anchor.line
        given, logged = self.tokens, ev.tokens
        if logged is not None and len(logged) == 0:
            logged = None
        looked_up = self._look_up(ev, line) if logged is None and given is None else None
        if logged is not None and given is not None and tuple(given) != tuple(logged):
            raise DumpError(self.source, line, f"--tokens {','.join(map(str, given))} differ from the token ids "
                                               f"the log printed ({','.join(map(str, logged))})")
        tokens, origin = ((logged, "log") if logged is not None else (given, "--tokens") if given is not None
                          else (looked_up, EMBEDDINGS))
        run = Run(ev.run, tuple(tokens), origin, line=line)  # type: ignore[arg-type]
        run.today = any(n.op == "SET_ROWS" for n in ev.nodes)
        self.check_count(run, ev, layers)
        self.check_shapes(layers)
        kv = layers[0].kv_type or "f16"
        kv_v = layers[0].v_type or kv
        for t in (kv, kv_v):
            if t not in KV_TYPES:
                raise DumpError(self.source, line, f"the KV cache is {t}: --model emulates {', '.join(KV_TYPES)} "
                                                   "caches only")
        run.kv = (kv, kv_v)
        # a quantized cache whose graph has no Hadamard rotation (roles.py k_rot): a build from before it
        quantized = [t not in ("f16", "bf16", "f32") for t in (kv, kv_v)]
        roles = {m.role for m in layers[0].mapped}
        run.rotates = not ((quantized[0] and "k_rot" not in roles) or
                           (quantized[1] and not quantized[0] and "v_rot" not in roles))
        first = next((L for L in layers if L.mapped and L.mapped[0].ref_layer == 0), None)
        # kq is MUL_MAT(k, q) with an f16 k: the most direct witness of the arithmetic (a 1-token prompt's kqv is V
        # itself, and q comes from the weights); a flash output has its own arithmetic
        probed = ("q",) if first is not None and first.flash else ("q", "kq", "kqv")
        run.probe = [(m, parse_sample(m.node, self.source), ev.n_past or 0, first.T) for m in (first.mapped if first
                     else []) if m.quantity in probed and not m.node.cut]
        self.current = run
        return run

    def _look_up(self, ev: Evaluation, line: int) -> tuple[int, ...]:
        """The evaluation's token ids from its printed embedding rows, or a DumpError naming those not found."""
        got = recover(self.model, ev, self.source)
        if got is None:
            raise MissingIds(self.source, line, "the log holds no token ids (llama.cpp before the `number of input "
                                               "tokens` lines) and prints no embedding rows to look them up from; "
                                               "pass them with --tokens 1,2,3")
        if not got.complete:
            known = ", ".join(f"{(ev.n_past or 0) + t}: {i}" for t, i in enumerate(got.ids) if i is not None)
            reasons: dict[str, list[int]] = {}
            for p, w in sorted(got.unknown.items()):
                reasons.setdefault(w, []).append(p)
            why = "; ".join(f"positions {_spans(ps)}: {w}" for w, ps in reasons.items())
            raise MissingIds(self.source, line, f"the log holds no token ids; looked up in the model's embeddings "
                                               f"(position: id): {known or 'none'}; the ids at {why}; pass them "
                                               "with --tokens 1,2,3")
        return tuple(int(i) for i in got.ids)  # type: ignore[arg-type]

    def _extend(self, run: Run, ev: Evaluation, layers: list[Layer]) -> None:
        """A later evaluation of a run whose ids were looked up: its own ids, and the reference over all of them
        (causal: earlier positions keep their values)."""
        ids = self._look_up(ev, layers[0].anchor.line)
        if len(run.tokens) != (ev.n_past or 0):
            raise DumpError(self.source, layers[0].anchor.line, "cannot place this evaluation's looked-up token ids: "
                                                                "an earlier one had no attention to count T")
        run.tokens = run.tokens + ids
        run.expected = None  # computed again over all of them when needed

    def parts(self, run: Run, work=None, eager: bool = False):
        """(Expected, has(m)) for the kept work of a run: eager, the whole reference at once (kept as run.expected:
        inspect and the HTML page read it); else one layer at a time (reference.forward_layers), each dropped
        before the next. The arithmetic is chosen on layer 0 (calibrated)."""
        if eager:
            if run.expected is None:
                run.expected = self._calibrated(run, lambda s1: iter([self._forward(run, s1)]))
            yield run.expected, lambda m: True
            return
        n_layer = self.model.hparams.n_layer
        at = 0  # not enumerate(): its result tuple holds the last layer until the next one is computed
        for exp in self._calibrated(run, lambda s1: self._forward_layers(run, s1), first_only=True):
            yield exp, (lambda m, at=at: m.ref_layer == at if m.ref_layer is not None else
                        at == (0 if m.role in INPUT_ROLES else n_layer))
            del exp  # not held while the next layer is computed
            give_back()
            at += 1

    @staticmethod
    def _flash(run: Run) -> flash.Plan | None:
        """The flash-attention kernel of each position (flash.py); None without flash attention."""
        return flash.plan(len(run.tokens), run.flash, run.kv[0], run.kv[1], run.today) if run.flash else None

    def _model(self, run: Run) -> Model:
        """The model as the run's build read it: a build before SET_ROWS (2024's) masked by a window today's
        ignore (phi3: Hparams.window_2024)."""
        hp = self.model.hparams
        if run.today or hp.window_2024 is None:
            return self.model
        return self.model.with_hparams(replace(hp, window=hp.window_2024))

    def _q_exact(self, run: Run) -> np.ndarray:
        """[n_tokens] True where kq's q was a contiguous view (an evaluation of one query, or one head), which a
        2024 build's tinyBLAS multiplied as f32 (attention.py)."""
        out = np.zeros(len(run.tokens), bool)
        for n_past, t in run.spans:
            if t == 1 or self.model.hparams.n_head == 1:
                out[n_past:n_past + t] = True
        return out

    def _forward(self, run: Run, f16_src1: str) -> Expected:
        try:
            ref = forward(self._model(run), run.tokens, kv_type=run.kv[0], v_type=run.kv[1], f16_src1=f16_src1,
                          rotates=run.rotates, fa=self._flash(run), twin=True,
                          q_exact=self._q_exact(run))
        except ValueError as e:
            raise DumpError(self.source, run.line,
                            f"--model cannot reproduce this run with {self.model.path}: {e}") from None
        return Expected(ref, run.kv[0], self.model)

    def _forward_layers(self, run: Run, f16_src1: str, twin: bool = True, attention_only: bool = False):
        try:
            for ref in forward_layers(self._model(run), run.tokens, kv_type=run.kv[0], v_type=run.kv[1],
                                      f16_src1=f16_src1, rotates=run.rotates, fa=self._flash(run), twin=twin,
                                      q_exact=self._q_exact(run), attention_only=attention_only):
                exp = Expected(ref, run.kv[0], self.model)
                del ref
                yield exp
                del exp  # not held while the next layer is computed
        except ValueError as e:
            raise DumpError(self.source, run.line,
                            f"--model cannot reproduce this run with {self.model.path}: {e}") from None

    def _calibrated(self, run: Run, make, first_only: bool = False):
        """The reference in the arithmetic this llama.cpp build used (reference.F16_SRC1), chosen on layer 0.

        An f16 src0 (F16 weights, an f16 V cache) multiplies a contiguous f32 src1 either converted to f16 (today)
        or as f32 (2024 builds with llamafile's tinyBLAS). Both are correct llama.cpp; they differ by ~1e-3 in
        layer 0's Qcur, which layer 0's bound must not absorb. The one whose layer-0 q and kqv fit print precision
        (all but the rare flips) is used, and the JSON says which. make(f16_src1) gives the reference's parts; the
        whole one (eager) or, first_only, an iterator of them whose first holds layer 0.
        """
        parts = make("convert")
        first = next(parts)
        run.arithmetic = {"f16_src1": "convert"}
        by = self._misfit(run, first)
        beyond, n = sum(b for b, _ in by.values()), sum(t for _, t in by.values())
        chosen = (first, parts)
        if any(t and b > MISFIT_SHARE * t for b, t in by.values()):
            beyond_alt = sum(b for b, _ in self._misfit(run, self._layer0(run, "f32")).values())
            run.arithmetic = {"f16_src1": "convert", "layer0_beyond_print": {"convert": beyond, "f32": beyond_alt},
                              "of": n}
            if beyond_alt < beyond:
                run.arithmetic["f16_src1"] = "f32"
                del first, parts, chosen  # not held beside the other arithmetic's pass
                alt_parts = make("f32")
                chosen = (next(alt_parts), alt_parts)
        fa = self._flash(run)
        if fa is not None:  # how many positions each kernel computed (flash.KERNELS)
            run.arithmetic["flash_kernels"] = {k: fa.kernels.count(k) for k in flash.KERNELS if k in fa.kernels}
        if not first_only:
            return chosen[0]
        return _chain(chosen[0], chosen[1])

    def _layer0(self, run: Run, f16_src1: str) -> Expected:
        """Layer 0 of the reference up to its attention, without a twin: what _calibrated weighs the other arithmetic
        on (q, kq, kqv). The whole pass and its twin are computed only if that arithmetic is chosen; most runs keep
        the first."""
        layers = self._forward_layers(run, f16_src1, twin=False, attention_only=True)
        try:
            return next(layers)
        finally:
            layers.close()

    def _misfit(self, run: Run, exp: Expected) -> dict[str, tuple[int, int]]:
        """Per quantity (q, kq, kqv), layer 0's printed elements beyond print precision (5e-5 + 2^-20|ref|) and how
        many there are (run.probe: those of the run's first evaluation): one quantity misfit is enough to try the
        other arithmetic (a 1-token prompt's kq is its only witness)."""
        by: dict[str, tuple[int, int]] = {}
        for m, s, n_past, T in run.probe:
            ref = exp.value(m.quantity, m.role, 0, key=m.key)
            g = locate(CANONICAL[m.quantity], m.labels, m.ne, n_past, T, tuple(s.index[1:]), ref.shape, m.via,
                       m.before)
            if g is None:
                continue
            want = g.take(ref)
            beyond = int(np.count_nonzero(~within(abs_error(s.values[0], want), PRINT + F32_REL * np.abs(want))))
            b, t = by.get(m.quantity, (0, 0))
            by[m.quantity] = (b + beyond, t + want.size)
        return by

    def check_count(self, run: Run, ev: Evaluation, layers: list[Layer]) -> None:
        """The run's token ids must cover this evaluation's queries, positions n_past .. n_past + T - 1."""
        T, n_past = layers[0].T, ev.n_past
        if n_past is None:
            raise DumpError(self.source, layers[0].anchor.line, "cannot place this evaluation: an earlier one had "
                                                                "no attention to count T")
        if n_past + T > len(run.tokens):
            said = {"--tokens": "--tokens gives", EMBEDDINGS: "the model's embeddings gave"}.get(run.origin,
                                                                                             "the log printed")
            raise DumpError(self.source, layers[0].anchor.line,
                            f"{said} {len(run.tokens)} token ids, but this evaluation holds queries at positions "
                            f"{n_past}..{n_past + T - 1}")

    def check_shapes(self, layers: list[Layer]) -> None:
        """Every layer's heads and widths must be the model's: else the dump is of another model."""
        hp, path = self.model.hparams, self.model.path
        for L in layers:
            got = (L.H, L.H_kv, L.D_h)
            want = (hp.n_head, hp.n_head_kv, hp.head_dim)
            if got != want or L.layer >= hp.n_layer:
                raise DumpError(self.source, L.anchor.line,
                                f"the model does not fit this dump: layer {L.layer} has {L.H} query heads, {L.H_kv} KV "
                                f"heads of D_h = {L.D_h}; {path} ({hp.arch}) has {hp.n_layer} layers, "
                                f"{hp.n_head} query heads, {hp.n_head_kv} KV heads of D_h = {hp.head_dim}")
            for m in L.mapped:
                if m.quantity == "rows" and m.key is None and not m.via:
                    width = {"result_output": hp.n_vocab, "kqv_unrot": hp.n_head * hp.head_dim}.get(m.role, hp.n_embd)
                    if m.node.ne[0] != width:
                        raise DumpError(self.source, m.node.line,
                                        f"the model does not fit this dump: '{m.node.name}' ({m.role}) is "
                                        f"{m.node.ne[0]} wide; {path} ({hp.arch}) gives {width}")

    def finish(self, complete: bool = True) -> None:
        """The end of a run: --tokens must have given exactly its tokens (unless checking stopped early)."""
        run = self.current
        if run is None:
            return
        self.finished.append({"run": run.index, "tokens": list(run.tokens), "tokens_from": run.origin,
                              "kv_type": run.kv[0], "v_type": run.kv[1], "queries_seen": run.T_seen,
                              "arithmetic": run.arithmetic, "sums_of": run.sum_mode})
        self.current = None
        if complete and run.origin == "--tokens" and run.T_seen != len(run.tokens):
            raise DumpError(self.source, run.line, f"--tokens gives {len(run.tokens)} token ids, but the run's "
                                                   f"evaluations hold {run.T_seen} queries")


def _chain(first, rest):
    """first, then rest's; first is not held once yielded (layer 0's Expected and its error terms are the largest
    part: [H, T, T] arrays, 0.2 GB at 547 tokens of gemma-3-270m)."""
    held = [first]
    del first
    yield held.pop()
    yield from rest
