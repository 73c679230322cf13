"""HeadWalk → the JSON document of `attncheck inspect --json` (schema 1): the content of render.py's tables, for
notebooks; dumped values that are not finite as strings, values not recomputed as null."""
from __future__ import annotations

import numpy as np

from .. import __version__
from ..sites.mask import REASONS, VISIBLE
from .records import HeadWalk, Rows

SCHEMA = 1


def _num(x) -> float | str | None:
    """Dumped values: non-finite as strings (JSON has none)."""
    x = float(x)
    return x if np.isfinite(x) else str(x)


def _maybe(x) -> float | str | None:
    """Recomputed values: NaN means not recomputed (null)."""
    x = float(x)
    return None if x != x else _num(x)


def _rows_dict(r: Rows | None, row_axis: str) -> dict | None:
    if r is None:
        return None
    return {"node": r.node.name, "line": r.node.line, "shape": list(r.shape), "row_axis": row_axis,
            "rows": r.rows.tolist(), "dims": r.cols.tolist(), "values": [[_num(v) for v in row] for row in r.values]}


def walk_dict(w: HeadWalk) -> dict:
    """The same content as the tables, as a versioned JSON document (`"schema": 1`)."""
    r, ws = w.row, w.weighted
    return {
        "schema": SCHEMA, "tool": "attncheck", "command": "inspect", "version": __version__, "source": w.source,
        "evaluation": w.evaluation, "run": w.run, "n_past": w.n_past, "T": w.T, "layer": w.layer,
        "head": w.head, "H": w.H, "H_kv": w.H_kv, "kv_head": w.kv_head, "D_h": w.D_h, "n_kv": w.n_kv,
        "kq_scale": {"value": w.kq_scale, "origin": w.scale_origin},
        "tokens": list(w.tokens) if w.tokens is not None else None,
        "token_text": list(w.token_texts) if w.token_texts is not None else None,
        "query": {"index": w.query, "position": w.position, "token": w.token(w.position), "chosen": w.query_origin},
        "shapes": [{"role": s.role, "node": s.name, "line": s.line, "op": s.op, "type": s.type, "ne": list(s.ne),
                    "head_axis": s.head_axis, "logical": s.logical, "logical_shape": list(s.logical_shape)}
                   for s in w.shapes],
        "Q_h": _rows_dict(w.Q_h, "query"), "K_h": _rows_dict(w.K_h, "slot"), "V_h": _rows_dict(w.V_h, "slot"),
        "scores": {
            "slots": r.slots.tolist(), "visible": r.visible.tolist(), "whole": r.whole,
            "kq": None if r.kq is None else [_num(v) for v in r.kq],
            "scaled": None if r.scaled is None else [_num(v) for v in r.scaled],
            "mask": [_num(v) for v in r.mask],
            "mask_ranges": [{"first": m.first, "last": m.last, "value": _maybe(m.value), "what": m.what}
                            for m in r.mask_ranges],
            "reason": None if r.reason is None else [REASONS[int(x)] for x in r.reason],
            "sink": r.sink, "sink_share": r.sink_share,
            "softmax": [_maybe(v) for v in r.softmax], "kq_soft_max": [_num(v) for v in r.kq_soft_max],
            "error": [_maybe(v) for v in r.error], "bound": [_maybe(v) for v in r.bound],
            "reference_slot": r.reference, "why_not": r.why_not or None,
        },
        "weighted_sum": None if ws is None else {
            "dims": ws.dims.tolist(), "slots": ws.slots.tolist(),
            "terms": [[_num(v) for v in row] for row in ws.terms],
            "weighted_sum": [_num(v) for v in ws.weighted_sum], "kqv": [_num(v) for v in ws.kqv],
            "error": [_num(v) for v in ws.error], "bound": [_num(v) for v in ws.bound],
        },
        "weighted_sum_why_not": w.weighted_why_not or None,
        "P_h": {"queries": w.P_queries.tolist(), "slots": w.P_slots.tolist(),
                "visible_slots": [0, w.n_visible_cols - 1],
                "weights": [[_num(v) for v in row] for row in w.P_h],
                "visible": (w.P_reason == VISIBLE).tolist()},
        "facts": list(w.facts),
        "compared": w.compared, "worst_ratio": w.worst_ratio, "passed": w.passed,
        "notes": list(w.notes),
        "window_unknown": w.window_unknown,
    }
