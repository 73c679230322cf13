"""HeadWalk → rich panels and tables for people (walk_json.py: the same content as a JSON document).

Everything reads without colour (NO_COLOR): elided indices are `…` rows/columns labelled with their logical range,
the heatmap uses shade characters and the printed numbers, masked cells are `·`.
"""
from __future__ import annotations

import numpy as np
from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ..dump.records import ne_text
from ..dump.vocabulary import per_kv_head
from ..arch.vocab import shown, token_unit
from ..present.columns import NEVER, Col, dropped, fit, fits
from ..sites.mask import OUTSIDE_WINDOW, REASONS, VISIBLE
from ..errors import markup as escape, printable
from .walk import HeadWalk, Rows, span

SHADES = " ░▒▓█"  # weight 0 .. 1 in five steps: the heatmap reads without colour
MASKED, ELIDED, WINDOWED = "·", "…", "×"


def _fmt(x: float, digits: int = 4) -> str:
    """Like llama.cpp's %.4f for dumped values; '-inf', 'nan' as printed; '−' for not recomputed."""
    if x != x:
        return "—"
    if np.isinf(x):
        return "-inf" if x < 0 else "inf"
    return f"{x:.{digits}f}"


def _err(x: float) -> str:
    return "—" if x != x else f"{x:.1e}"


def _ok(err: float, bound: float) -> str:
    if bound != bound:
        return ""
    return "[green]ok[/]" if err <= bound else "[bold red]FAIL[/]"


def _gaps(printed: np.ndarray, n: int) -> list[int | tuple[int, int]]:
    """Printed indices in order, with (first, last) for each run of unprinted ones below n."""
    out: list[int | tuple[int, int]] = []
    prev = -1
    for i in (int(x) for x in printed if x < n):
        if i > prev + 1:
            out.append((prev + 1, i - 1))
        out.append(i)
        prev = i
    if prev < n - 1:
        out.append((prev + 1, n - 1))
    return out


def _label(gap: tuple[int, int]) -> str:
    return f"{gap[0]}..{gap[1]}" if gap[1] > gap[0] else str(gap[0])


def _tok(w: HeadWalk, position: int) -> str:
    t, text = w.token(position), w.token_text(position)
    return "" if t is None else f" tok {t}" + ("" if text is None else f" {shown(text, markup=True)}")


def header(w: HeadWalk) -> Panel:
    """Which evaluation, layer, head and query; GQA mapping; D_h, n_kv, kq_scale."""
    gqa = (f"head {w.head} reads KV head {w.kv_head} (H = {w.H} query heads share H_kv = {w.H_kv} KV heads: "
           f"head h reads KV head h // {w.H // w.H_kv})" if w.H_kv != w.H
           else f"head {w.head} reads KV head {w.kv_head} (H = H_kv = {w.H}: no head sharing)")
    lines = [
        f"[bold]{escape(w.source)}[/]  evaluation {w.evaluation} (run {w.run}, n_past {w.n_past}, T {w.T})  "
        f"layer {w.layer}  head {w.head} of 0..{w.H - 1}",
        gqa,
        f"D_h = {w.D_h}   n_kv = {w.n_kv}   kq_scale = {w.kq_scale:.6g} ({w.scale_origin})",
        f"query {w.query}: position {w.position}"
        f"{'' if w.token(w.position) is None else f', token {w.token(w.position)}'} ({w.query_origin})",
    ]
    tokens = tokens_line(w)
    if tokens is not None:
        lines.append(tokens)
    lines += [f"fact: {escape(f)}" for f in w.facts[1:]]
    if w.row.sink is not None:
        share = "" if w.row.sink_share is None else f"; it takes {w.row.sink_share:.4f} of this row (1 − Σ_j p_j)"
        lines.append(f"attention sink of head {w.head}: logit {w.row.sink:.4f}{share}")
    return Panel("\n".join(lines), title="attncheck inspect", title_align="left", box=box.ROUNDED)


class _Rows:
    """Columns and rows, laid out by present/columns.fit for the console's width when printed."""

    def __init__(self, *cols: Col):
        self.cols, self.rows = list(cols), []

    def add_row(self, *cells) -> None:
        self.rows.append(cells)

    def table(self, width: int | None) -> Table:
        return fit(self.cols, self.rows, width)


def _col(header: str, left: bool = False, keep: int = 5, wrap: bool = False, min_width: int = 0) -> Col:
    return Col(header, "left" if left else "right", keep, wrap, min_width)


def _titled(title: str, rows: _Rows, width: int | None, *after) -> Group:
    """A title above a table (not squeezed to the table's width), and a line naming the columns left out."""
    table = rows.table(width)
    gone = dropped(table, rows.cols)
    note = [Text(f"columns left out for the terminal's width: {', '.join(gone)} (--json has them)", style="dim")]
    return Group(Text(printable(title), style="bold"), table, *after, *(note if gone else []))


def shape_table(w: HeadWalk, width: int | None = None) -> Group:
    """GGML ne of every node beside the logical per-head shape and the GGML axis that holds heads."""
    t = _Rows(_col("node", True, NEVER, wrap=True, min_width=12), _col("line", keep=3), _col("op", True, keep=4),
              _col("type", True, keep=2), _col("GGML ne", True, keep=7), _col("head axis", True, 6, wrap=True),
              _col("per head", True, 8, wrap=True, min_width=16))
    for s in w.shapes:
        kv = " (KV)" if per_kv_head(s.role) else ""
        axis = "?" if s.head_axis is None else f"ne{s.head_axis}{kv}"
        t.add_row(escape(s.name), str(s.line), s.op, s.type, ne_text(s.ne), axis,
                  escape(f"{s.logical} = [{s.logical_shape[0]}, {s.logical_shape[1]}]"))
    return _titled("shapes: GGML ne {ne0, ne1, ne2, ne3}, ne0 contiguous; the head axis indexes heads "
                   "(KV heads for the K and V cache views, which hold V_h transposed)", t, width)


def _keep(i: int, n: int) -> int:
    """How much a printed column is needed: the first and last most, those next to the elision least."""
    return max(2, 6 - min(i, n - 1 - i))


def rows_table(w: HeadWalk, r: Rows, what: str, width: int | None = None) -> Group:
    """A printed per-head matrix with its elided rows and dims shown as labelled `…`."""
    row_kind = "query" if r.name == "Q_h" else "slot"
    cols = _gaps(r.cols, r.shape[1])
    t = _Rows(_col(row_kind, True, NEVER, wrap=True, min_width=8),
              *(_col(f"dims {c[0]}..{c[1]}" if isinstance(c, tuple) else f"d{c}", keep=9 if isinstance(c, tuple)
                     else _keep(i, len(cols)), wrap=isinstance(c, tuple)) for i, c in enumerate(cols)))
    pos = {int(x): i for i, x in enumerate(r.rows)}
    cpos = {int(x): i for i, x in enumerate(r.cols)}
    for item in _gaps(r.rows, r.shape[0]):
        if isinstance(item, tuple):
            a, b = item
            label = (f"{'queries' if row_kind == 'query' else 'slots'} {a}..{b}" if b > a else f"{row_kind} {a}")
            t.add_row(f"[dim]{label}[/]", *[ELIDED] * len(cols))
            continue
        vals = r.values[pos[item]]
        if row_kind == "query":
            label = f"{'▶' if item == w.query else ' '} {item} (pos {w.n_past + item}{_tok(w, w.n_past + item)})"
        else:
            reason = int(w.row.reason[list(w.row.slots).index(item)]) if w.row.reason is not None else VISIBLE
            state = REASONS[reason].split(" (")[0]
            label = f"{'▶' if reason == VISIBLE else ' '} {item}{_tok(w, w.slot_base + item)} ({state})"
        t.add_row(label, *[ELIDED if isinstance(c, tuple) else _fmt(vals[cpos[c]]) for c in cols])
    return _titled(f"{r.name} [{r.shape[0]}, {r.shape[1]}] {what}, from '{r.node.name}' (line {r.node.line})", t,
                   width)


def scores_table(w: HeadWalk, width: int | None = None) -> Group:
    """The chosen query over the printed slots: kq, ·kq_scale, mask, softmax recomputed vs dumped, error, bound."""
    r = w.row
    how = (f"recomputed relative to slot {r.reference}: p_j = p_{r.reference}·exp(kq_scale·(s_j − s_{r.reference}))"
           if r.reference is not None else "softmax over the visible slots")
    t = _Rows(_col("slot", True, NEVER, wrap=True, min_width=5), _col("kq s_j", keep=4),
              _col("s_j·scale", keep=2), _col("mask", keep=3), _col("softmax", keep=7),
              _col("kq_soft_max", keep=8), _col("|err|", keep=5), _col("bound", keep=6),
              _col("", True, NEVER, wrap=True))
    pos = {int(x): i for i, x in enumerate(r.slots)}
    for item in _gaps(r.slots, w.n_kv):
        if isinstance(item, tuple):
            a, b = item
            t.add_row(f"[dim]{_label(item)}[/]", ELIDED, ELIDED, _mask_of(w, a, b), "", ELIDED, "", "",
                      "[dim]not printed[/]")
            continue
        i = pos[item]
        kq = "—" if r.kq is None else _fmt(r.kq[i])
        sc = "—" if r.scaled is None else _fmt(r.scaled[i], 6)
        ref = "[dim]reference[/]" if item == r.reference else ""
        mask = "0" if r.mask[i] == 0 else (_fmt(r.mask[i], 0) if not np.isfinite(r.mask[i]) else _fmt(r.mask[i], 4))
        t.add_row(f"{item}{_tok(w, w.slot_base + item)}", kq, sc, mask,
                  _fmt(r.softmax[i], 6), _fmt(r.kq_soft_max[i]), _err(r.error[i]), _err(r.bound[i]),
                  _ok(r.error[i], r.bound[i]) or ref)
    return _titled(f"query {w.query} (position {w.position}): s_j = kq, x_j = s_j·{w.kq_scale:.6g} + mask_j, "
                   f"p_j = softmax(x)_j, {how}", t, width)


def _mask_of(w: HeadWalk, a: int, b: int) -> str:
    vals = {_mask_word(m.value) for m in w.row.mask_ranges if m.first <= b and m.last >= a}
    return vals.pop() if len(vals) == 1 else "/".join(sorted(vals))


def _mask_word(v: float) -> str:
    return "0" if v == 0 else ("-inf" if v == -np.inf else "bias")


def mask_line(w: HeadWalk) -> str:
    """The chosen query's mask over every slot, as runs of one reason; where the window is not known (no model) and
    the printed weights do not confirm the visible slots, those are said to be visible unless a window masks them."""
    def what(m) -> str:
        if w.window_unknown and m.what.startswith("visible"):
            return (f"{m.what} by causality, {_mask_word(m.value)}, unless a sliding window masks the earliest (its "
                    "size is not known without --model)")
        return f"{m.what}, {_mask_word(m.value).replace('-inf', '−inf')}"

    return "mask row: " + "; ".join(
        f"slot{'s' if m.last > m.first else ''} {m.first}{'..' + str(m.last) if m.last > m.first else ''}: {what(m)}"
        for m in w.row.mask_ranges)


AROUND = 5  # tokens either side of the walked query's that the header shows (a long run's are counted, not listed)


def tokens_line(w: HeadWalk) -> str | None:
    """The run's tokens in the header: all of a short run; of a longer one, the count and the walked query's
    neighbourhood, its own token marked ▶. Each id and text one unit, never broken across lines."""
    if w.tokens is None:
        return None
    n, pos = len(w.tokens), w.position
    lo, hi = (0, n) if n <= 2 * AROUND + 1 else (max(0, min(pos - AROUND, n - 2 * AROUND - 1)), 0)
    hi = hi or min(n, lo + 2 * AROUND + 1)
    texts = w.token_texts or (None,) * n
    units = [("▶" if i == pos and (lo, hi) != (0, n) else "") + token_unit(w.tokens[i], texts[i], markup=True)
             for i in range(lo, hi)]
    sep = "  " if w.token_texts is not None else " "
    if (lo, hi) == (0, n):
        return "tokens of the run: " + sep.join(units)
    return (f"tokens of the run: {n}; positions {lo}..{hi - 1}, around the query's (▶): "
            + ("… " if lo else "") + sep.join(units) + (" …" if hi < n else ""))


def weighted_table(w: HeadWalk, width: int | None = None) -> Group | None:
    """O_h[t, d] = Σ_j p_j v_j (dumped p_j, V_h of the KV head) beside the dumped kqv, per printed dim."""
    ws = w.weighted
    if ws is None:
        return None
    show_terms = len(ws.slots) <= 3
    terms_col = "p_j·V_h[j, d] terms"
    t = _Rows(_col("dim", True, NEVER), *([_col(terms_col, True, 1, wrap=True, min_width=20)] if show_terms else []),
              _col("Σ p_j v_j", keep=7), _col("kqv", keep=8), _col("|err|", keep=5), _col("bound", keep=6),
              _col("", True, NEVER))
    p = w.row.kq_soft_max[w.row.visible]
    vpos = {int(x): i for i, x in enumerate(w.V_h.rows)} if w.V_h is not None else {}
    for i, d in enumerate(ws.dims):
        terms = []
        if show_terms:
            terms = [" + ".join(f"{pj:.4f}·{_paren(w.V_h.values[vpos[int(j)], i])}" for pj, j in zip(p, ws.slots))]
        t.add_row(f"d{d}", *terms, _fmt(ws.weighted_sum[i], 6), _fmt(ws.kqv[i]), _err(ws.error[i]),
                  _err(ws.bound[i]), _ok(ws.error[i], ws.bound[i]))
    return _titled(f"O_h[{w.query}, d] = Σ_j p_j·V_h[j, d] over the visible slots {span(ws.slots)} "
                   f"(p_j as dumped in kq_soft_max; V_h of KV head {w.kv_head})", t, width)


def _paren(v: float) -> str:
    return f"({v:.4f})" if v < 0 else f"{v:.4f}"


def _shade(p: float) -> str:
    return SHADES[min(len(SHADES) - 1, max(0, int(p * len(SHADES))))] if p == p else "?"


def _heat_style(p: float) -> str:
    """Dark blue (0) to yellow (1); dropped entirely under NO_COLOR."""
    p = 0.0 if p != p else min(1.0, max(0.0, p))
    r, g, b = int(40 + 215 * p), int(60 + 160 * p), int(140 - 120 * p)
    return f"rgb({r},{g},{b})"


def heatmap(w: HeadWalk, width: int | None = None) -> Group:
    """P_h: printed queries × visible slots 0..n_past+T−1; shade + dumped weight, `·` masked, `…` not printed.

    Where the shaded cells do not fit the width, the cells keep their colour and number without the shade
    characters; where those do not fit either, the slots next to the elision go first."""
    cols = _gaps(w.P_slots, w.n_visible_cols)
    spos = {int(x): i for i, x in enumerate(w.P_slots)}
    qpos = {int(x): i for i, x in enumerate(w.P_queries)}

    def layout(shaded: bool) -> _Rows:
        t = _Rows(_col("query", True, NEVER, wrap=True, min_width=6),
                  *(_col(_label(c) if isinstance(c, tuple) else f"slot {c}{_tok(w, c)}", keep=9 if isinstance(c, tuple)
                         else _keep(i, len(cols)), wrap=True) for i, c in enumerate(cols)))
        for item in _gaps(w.P_queries, w.T):
            if isinstance(item, tuple):
                t.add_row(f"[dim]quer{'ies' if item[1] > item[0] else 'y'} {_label(item)}[/]", *[ELIDED] * len(cols))
                continue
            cells: list[Text | str] = []
            for c in cols:
                if isinstance(c, tuple):
                    seen = w.visible_all[qpos[item], c[0]:c[1] + 1].any()
                    cells.append(ELIDED if seen else MASKED)
                elif w.P_reason[qpos[item], spos[c]] != VISIBLE:
                    cells.append(MASKED if w.P_reason[qpos[item], spos[c]] != OUTSIDE_WINDOW else WINDOWED)
                else:
                    p = float(w.P_h[qpos[item], spos[c]])
                    cells.append(Text(f"{_shade(p) * 2} {_fmt(p)}" if shaded else _fmt(p), style=_heat_style(p)))
            mark = "▶" if item == w.query else " "
            t.add_row(f"{mark} {item} (pos {w.n_past + item}{_tok(w, w.n_past + item)})", *cells)
        for c in t.cols[1:]:  # centred, as the shades were drawn
            t.cols[t.cols.index(c)] = c._replace(justify="center")
        return t

    t = layout(True)
    if not fits(t.cols, t.rows, width):
        t = layout(False)
    empty = f"; slots {w.n_visible_cols}..{w.n_kv - 1} are empty (weight 0)" if w.n_visible_cols < w.n_kv else ""
    legend = Text("shade: '  ' <0.2  ░░ <0.4  ▒▒ <0.6  ▓▓ <0.8  ██ ≥0.8;  "
                  f"{MASKED} masked (later slot, −inf);  {WINDOWED} outside the sliding window (−inf);  "
                  f"{ELIDED} visible but not printed", style="dim")
    return _titled(f"P_h = kq_soft_max of head {w.head}: queries × visible slots 0..{w.n_visible_cols - 1}{empty}",
                   t, width, legend)


def verdict(w: HeadWalk) -> str:
    n_w = int(np.count_nonzero(~np.isnan(w.row.bound) & w.row.visible))
    n_m = int(np.count_nonzero(~w.row.visible))
    n_o = len(w.weighted.dims) if w.weighted is not None else 0
    what = f"{n_w} visible weights, {n_m} masked weights, {n_o} kqv elements of query {w.query}"
    if w.passed:
        return f"[bold green]PASS[/] {what} within their bounds (worst |err|/bound {w.worst_ratio:.2f})"
    return f"[bold red]FAIL[/] {what}: some beyond their bounds (worst |err|/bound {w.worst_ratio:.2f})"


def render_walk(w: HeadWalk, console: Console) -> None:
    """Print the whole walk: header, shapes, Q_h/K_h/V_h, the query's row, the weighted sum, the heatmap."""
    width = console.width
    console.print(header(w))
    console.print(shape_table(w, width))
    if w.Q_h is not None:
        console.print(rows_table(w, w.Q_h, f"of head {w.head}: ▶ the chosen query", width))
    for r in (w.K_h, w.V_h):
        if r is not None:
            console.print(rows_table(w, r, f"of KV head {w.kv_head}: ▶ slots visible to query {w.query}", width))
    console.print(f"kq = K_h·q_{w.query} needs all D_h = {w.D_h} dims of q and k; the dump prints "
                  f"{len(w.K_h.cols) if w.K_h is not None else 0}: raw scores are shown as dumped, not recomputed",
                  style="dim")
    console.print(scores_table(w, width))
    console.print(escape(mask_line(w)), style="dim")
    if w.row.why_not:
        console.print(f"softmax: {escape(w.row.why_not)}", style="yellow")
    table = weighted_table(w, width)
    if table is not None:
        console.print(table)
    else:
        console.print(f"weighted sum not recomputed: {escape(w.weighted_why_not)}", style="yellow")
    console.print(heatmap(w, width))
    for note in w.notes:
        console.print(f"note: {escape(note)}", style="yellow")
    console.print(verdict(w))
