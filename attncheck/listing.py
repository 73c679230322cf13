"""What dumps hold, evaluation by evaluation and layer by layer: `attncheck list` for Python (list_dump)."""
from __future__ import annotations

from typing import BinaryIO

from .errors import printable


def list_dump(dump: str | BinaryIO = "-", *, model=None, jobs: int | None = None,
              limit: int | None = None) -> dict:
    """`attncheck list DUMP` for Python: one dump's entry of `attncheck list --json` ("dumps": [...]): its source,
    evaluations (a count), rows (one per layer of each evaluation: its kind of attention, nodes and their lines, H,
    H_kv, D_h, n_kv), runs (their line and token ids; with a model, each token's text) and warnings. The dump is
    read in parts on `jobs` processes (dump/pool.py); limit: the rows of the first `limit` evaluations only (all
    are counted), so that memory does not grow with the dump. model: a path, or the context a command opened
    (arch/context.py). A DumpError for an unusable dump or model."""
    from .arch.context import open_model
    from .arch.vocab import token_text
    from .dump.pool import Replay, gathered, jobs_default
    from .dump.graph import read_dump
    from .dump.listing import listed

    meta = open_model(model).meta if model is not None else None
    d = read_dump(dump)
    replay = Replay(d.source)
    rows, notes, evaluations = [], [], 0
    for part in gathered(d.stream, d.source, None, jobs or jobs_default(), take=listed):
        for ev in replay.take(part):
            evaluations += 1  # each has a row at least (listing.rows)
            if limit is None or evaluations <= limit:
                rows += [r._asdict() for r in ev.renumbered()]
        notes += part.notes
        if part.error is not None:
            raise part.error
    return {"source": d.source, "evaluations": evaluations,
            "rows": [{**r, "names": list(r["names"]), "lines": list(r["lines"])} for r in rows],
            "runs": [{"line": r.line, "tokens": None if r.tokens is None else list(r.tokens),
                      **({} if meta is None else {"token_text": token_text(meta, r.tokens)})} for r in replay.runs],
            "warnings": [f"{d.source}:{n.line}: {printable(n.message)}" for n in notes]}
