"""Reports → one self-contained HTML page: the verdict and coverage, the attention facts used, a layer × head grid
per evaluation (and the worst over evaluations), and the head view (P and O heatmaps, sliders) that the page's
script draws when a grid cell is clicked.

The page is one file: CSS and script inline (page.css, page.js, page.html beside this module), no network (its
Content-Security-Policy allows nothing else), opens from disk. The summary and the grid are plain HTML, so they
read without JavaScript (the worst-over-evaluations grid's cells carry their counts in a title; an
evaluation's cells get theirs from the script on hover); the head view needs it.

Untrusted text: node names, log lines and token text come from files nobody here wrote. Every such string is
escaped where it lands: html.escape for element text and attribute values, and the data the script reads is JSON
with <, > and & written as \\u escapes inside a <script type="application/json">, which the script puts into the
page with textContent only.
"""
from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from importlib import resources
from string import Template

from .. import __version__
from ..errors import printable
from ..sites.mask import REASONS as MASK_REASONS
from .page import PageData
from .render import coverage_lines, failure_lines, verdict
from ..report import Report

# A cell's colour: its need (worst |err|/bound). Passing (need ≤ 1) is one calm green, shaded faintly by need (≤ 0.5,
# ≤ 0.9, ≤ 1: ok1..ok3); failing is red (`failing`); nothing compared is grey (`np`). A correct run's need is 0.9 to
# 1 at print precision by design (the bounds are tight), so the shades must not read as a warning.
PASS_SHADES = (0.5, 0.9)
WARNINGS_SHOWN = 50


def esc(text: object) -> str:
    """Text from anywhere as HTML element text or a quoted attribute value: one visible line, markup escaped."""
    return html.escape(printable(str(text)), quote=True)


def _clean(x):
    """JSON the browser parses: non-finite floats as strings (JSON has no NaN or Infinity)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def script_json(data: object) -> str:
    """Data for <script type="application/json">: no <, > or & left that could end the element or open markup."""
    text = json.dumps(_clean(data), ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def document(title: str, body: str, data: dict, kind: str) -> str:
    """The whole page: body is HTML already escaped; data goes to the script as JSON."""
    data = {**data, "reasons": MASK_REASONS}
    return Template(asset("page.html")).substitute(
        title=esc(title), css=asset("page.css"), js=asset("page.js"), body=body, data=script_json(data),
        kind=esc(kind), version=esc(__version__))


def write_page(path: str, text: str) -> None:
    """Write the page (OSError for the command line to report)."""
    with open(path, "w", encoding="utf-8", errors="replace") as f:
        f.write(text)


def lines(items: list[str], cls: str, limit: int | None = None) -> str:
    if not items:
        return ""
    shown = items if limit is None else items[:limit]
    more = f"<li>… and {len(items) - len(shown)} more</li>" if len(items) > len(shown) else ""
    return f'<ul class="lines {cls}">' + "".join(f"<li>{esc(x)}</li>" for x in shown) + more + "</ul>"


def table(header: tuple[str, ...], rows: list[tuple], cls: str = "list") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


# ---- the attention facts -------------------------------------------------------------------------------

def _value(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if v is None or isinstance(v, (str, int, bool)):
        return "—" if v is None else str(v)
    return json.dumps(_clean(v), ensure_ascii=False, separators=(", ", ": "))


def _is_fact(f: object) -> bool:
    return isinstance(f, dict) and "value" in f


def fact_rows(facts: object, group: str = "") -> list[tuple[str, str, str, str]]:
    """A report's `facts` entry, whatever it holds: facts (dicts with a value and an origin, other keys shown as
    details) by name in a dict or in a list, or groups of them (a run's record: its facts, and how they were
    pinned as details); anything else as a bare value."""
    items = facts.items() if isinstance(facts, dict) else enumerate(facts if isinstance(facts, list) else [facts])
    out = []
    for key, f in items:
        if isinstance(f, dict) and not _is_fact(f) and any(_is_fact(v) for v in f.values()):
            label = f"run {f['run']}" if "run" in f else str(key)
            out += fact_rows({k: v for k, v in f.items() if _is_fact(v)}, label)
            rest = {k: v for k, v in f.items() if not _is_fact(v) and k != "run" and v not in (None, [], {}, "")}
            if rest:
                out.append((f"{label}: how", "", "", ", ".join(f"{k}: {_value(v)}" for k, v in rest.items())))
            continue
        if isinstance(f, dict):
            name = str(f.get("name", f.get("fact", key)))
            rest = {k: v for k, v in f.items() if k not in ("name", "fact", "value", "origin") and v is not None}
            out.append((f"{group} {name}".strip(), _value(f.get("value")), _value(f.get("origin")),
                        ", ".join(f"{k}: {_value(v)}" for k, v in rest.items())))
        else:
            out.append((f"{group} {key}".strip(), _value(f), "", ""))
    return out


def facts_table(report: Report, doc: dict) -> str:
    """The attention facts the checks used, and where each came from."""
    rows: list[tuple[str, str, str, str]] = []
    if not doc.get("facts"):  # a report from before facts were pinned per run: the scale is all it knows
        ks = doc["kq_scale"]
        scales = sorted({s.kq_scale for s in report.sites})
        value = ks["value"] if ks["value"] is not None else ", ".join(f"{x:.6g}" for x in scales) or "—"
        rows.append(("kq_scale", _value(value), ks["origin"], ""))
    inferred = doc["inferred_kq_scale"]
    if inferred["value"] is not None:
        rows.append(("kq_scale inferred", _value(inferred["value"]), "the printed weights and scores",
                     f"{inferred['rows']} rows"))
    rows.append(("bounds", "atol/rtol" if report.tolerance else "per element", doc["tolerance"]["origin"], ""))
    model = doc.get("model")
    if model:
        hp = model.get("hparams", {})
        rows.append(("model", f"{model.get('path')} ({model.get('arch')})", "--model",
                     ", ".join(f"{k}: {_value(v)}" for k, v in hp.items())))
    if doc.get("facts"):
        rows.extend(fact_rows(doc["facts"]))
    return table(("fact", "value", "origin", "details"), rows, "facts")


# ---- the grid ------------------------------------------------------------------------------------------

def bucket(ratio: float | str, failed: int) -> str:
    """The class of a cell of need `ratio` (≤ 1 passes; NaN does not) with `failed` elements beyond their bound."""
    r = float(ratio)
    if failed or not r <= 1:
        return "failing"
    return f"ok{1 + sum(r > b for b in PASS_SHADES)}"


def _figure(f: list) -> str:
    n, failed, ratio, check = f
    return (f"need {float(ratio):.2f} (worst |err|/bound" + (f", {check}" if check else "") +
            f"); {n} elements compared, {failed} beyond their bound")


def cell_class(f: list | None) -> str:
    """A figure's cell class: grey when nothing was compared (not printed, or nothing of it comparable)."""
    if f is None or (not f[0] and not f[1]):
        return "np"
    return bucket(f[2], f[1])


def head_cell(site: dict, h: int) -> str:
    """A head's cell of an evaluation's grid: its colour and ✗; the page's script gives its counts on hover (the
    worst-over-evaluations grid carries them in the HTML), so that a long run's grids stay small."""
    f = site["fig"].get(h)
    return f'<td class="c {cell_class(f)}">{"✗" if f and f[1] else ""}</td>'


def layer_cell(site: dict) -> str:
    f = site["lfig"]
    if f is None:
        return '<td class="x"></td>'
    return f'<td class="lc {cell_class(f)}">{"✗" if f[1] else ""}</td>'


def eval_grid(d: int, e: int, sites: dict, layers: list[int], H: int) -> str:
    first = next(s for (ev, _), s in sites.items() if ev == e)
    cap = f"eval {e} · run {first['run']} · positions {first['n_past']}..{first['n_past'] + first['T'] - 1}"
    rows = []
    for layer in layers:
        s = sites.get((e, layer))
        if s is None:
            rows.append(f'<tr data-l="{layer}"><th>{layer}</th>' + '<td class="x"></td>' * (H + 1) + "</tr>")
            continue
        cells = "".join(head_cell(s, h) if h < s["H"] else '<td class="x"></td>' for h in range(H))
        rows.append(f'<tr data-l="{layer}"><th>{layer}</th>{cells}{layer_cell(s)}</tr>')
    return (f'<table class="grid ev" data-d="{d}" data-e="{e}"><caption>{esc(cap)}</caption>'
            f'<thead><tr><th>layer</th>{"".join(f"<th>{h}</th>" for h in range(H))}<th>all</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def worst_grid(d: int, sites: dict, layers: list[int], H: int, n_evs: int) -> str:
    """Per layer and head, the worst over the evaluations (a click opens the evaluation it came from)."""
    by_layer: dict[int, list[tuple[int, dict]]] = {}
    for (e, lay), s in sites.items():
        by_layer.setdefault(lay, []).append((e, s))
    rows = []
    for layer in layers:
        cells = []
        for h in range(H):
            figs = [(s["fig"][h], e) for e, s in by_layer[layer] if cell_class(s["fig"].get(h)) != "np"]
            if not figs:
                ev = by_layer[layer][0][0]
                cells.append(f'<td class="np" data-h="{h}" data-e="{ev}" title="layer {layer} head {h}: no element '
                             'compared"></td>')
                continue
            (f, e) = max(figs, key=lambda fe: (fe[0][1] > 0, float(fe[0][2])))
            failing = sum(1 for g, _ in figs if g[1])
            title = (f"layer {layer} head {h}, worst of {len(figs)} evaluations: eval {e}, {_figure(f)}; failing in "
                     f"{failing} evaluations")
            cells.append(f'<td class="{bucket(f[2], failing)}" data-h="{h}" data-e="{e}" title="{esc(title)}">'
                         f'{"✗" if failing else ""}</td>')
        rows.append(f'<tr data-l="{layer}"><th>{layer}</th>{"".join(cells)}</tr>')
    return (f'<table class="grid worst" data-d="{d}"><caption>worst over {n_evs} evaluations</caption>'
            f'<thead><tr><th>layer</th>{"".join(f"<th>{h}</th>" for h in range(H))}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


LEGEND = ('<p class="need">A cell is one head. Its <b>need</b> is the worst |err| ÷ bound over '
          'the head\'s compared elements: err is the printed value minus the recomputed one, the bound how far a '
          'correct llama.cpp may be from it. need ≤ 1 passes. The bounds are tight by design, so a correct run\'s '
          'need is often 0.9 to 1: every passing head is green, shaded only faintly by need.</p><div class="legend">'
          '<span><span class="sw ok1"></span>passes, need ≤ 0.5</span>'
          '<span><span class="sw ok2"></span>≤ 0.9</span><span><span class="sw ok3"></span>≤ 1</span>'
          '<span><span class="sw failing">✗</span>fails: need &gt; 1</span>'
          '<span><span class="sw np"></span>not checked (not printed, or nothing of it comparable)</span>'
          '<span>hover a cell for its counts; click it for the head</span></div>')


def grids(d: int, pd: PageData) -> str:
    if not pd.sites:
        return ""
    sites = {(s["e"], s["l"]): s for s in pd.sites}
    evs = sorted({e for e, _ in sites})
    layers = sorted({lay for _, lay in sites})
    H = max(s["H"] for s in pd.sites)
    per_eval = "".join(eval_grid(d, e, sites, layers, H) for e in evs)
    return (f"<h3>layer × head</h3>{LEGEND}<div class=\"grids\">{worst_grid(d, sites, layers, H, len(evs))}</div>"
            f"<h3>per evaluation</h3><div class=\"grids\">{per_eval}</div>")


# ---- the page ------------------------------------------------------------------------------------------

def summary(report: Report, doc: dict) -> str:
    parts = [f'<p class="verdict {report.verdict}">{esc(verdict(report))}</p>',
             lines(failure_lines(report), "failures")]
    if report.hint:
        parts.append(f'<p class="hint">hint: {esc(report.hint)}</p>')
    parts += [lines(coverage_lines(report), "coverage"), "<h3>attention facts</h3>", facts_table(report, doc),
              lines(report.warnings, "warnings", WARNINGS_SHOWN)]
    return "".join(parts)


def token_texts(tokens: dict[int, list[int]], vocab: Sequence[str] | None) -> dict[int, str] | None:
    """The text of the prompt's tokens only (not the whole vocabulary), when a model gave one."""
    if vocab is None:
        return None
    return {i: vocab[i] for ids in tokens.values() for i in ids if 0 <= i < len(vocab)}


def check_page(checked: list[tuple[Report, PageData]], vocab: Sequence[str] | None = None,
               errors: list[str] = ()) -> str:
    """The page of `attncheck check` (and `run`): one section per dump, unusable ones as their error line."""
    body, dumps = [], []
    for d, (report, pd) in enumerate(checked):
        doc = report.to_dict()
        body.append(f'<section class="dump" data-d="{d}"><h2>{esc(report.source)}</h2>{summary(report, doc)}'
                    f"{grids(d, pd)}</section>")
        dumps.append({"source": report.source, "sites": pd.sites, "tokens": pd.tokens, "strings": pd.strings,
                      "vocab": token_texts(pd.tokens, vocab)})
    for e in errors:
        body.append(f'<section class="dump"><p class="verdict error">{esc(e)}</p></section>')
    body.append('<section id="head-view" hidden></section>')
    title = "attncheck: " + (checked[0][0].source if len(checked) == 1 and not errors else
                             f"{len(checked) + len(errors)} dumps")
    return document(title, "".join(body), {"kind": "check", "dumps": dumps, "open": None}, "check")
