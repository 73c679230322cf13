"""One head walked by hand (walk.py), with the model's side of it (model_walk.py, flash.py), for people
(render.py, html.py) and as JSON.

The package is callable (commands.py): `attncheck.inspect(dump, layer, head, ...)` is `attncheck inspect` for Python.
"""
from __future__ import annotations

from ..commands import callable_module


def inspect(dump, layer: int, head: int, *, query: int | None = None, evaluation: int = 0,
            kq_scale: float | None = None, model=None, tokens: tuple[int, ...] | None = None):
    """`attncheck inspect DUMP --layer L --head H` for Python: walk one head for one query (default: the last whose
    visible slots are all printed) of an evaluation; with a model (a GGUF path, or the context a command opened:
    arch/context.py), its reference's full rows and checks too. The inspection.Inspection its JSON is made from (`.to_dict()`, `.passed`, `.exit_code`). A dump
    without scores or weights (flash attention) needs the model and a path: walk.NothingToInspect without them
    (the command's exit 3); a layer, head, query or evaluation that was not printed is a DumpError."""
    import os

    from ..arch.context import open_model
    from .model_walk import walk_head
    from .inspection import Inspection
    from .walk import NothingToInspect

    model = open_model(model) if model is not None else None  # its header read once for the walk and the flash walk
    try:
        w, mw = walk_head(dump, layer, head, query=query, evaluation=evaluation, kq_scale=kq_scale, model=model,
                          tokens=tokens)
    except NothingToInspect:
        if model is None or not isinstance(dump, (str, os.PathLike)):
            raise
        from .flash import flash_walk

        f, mw = flash_walk(str(dump), layer, head, model, query=query, evaluation=evaluation, kq_scale=kq_scale,
                           tokens=tokens)
        return Inspection(model=mw, flash=f)
    return Inspection(walk=w, model=mw)


callable_module(__name__, inspect)
