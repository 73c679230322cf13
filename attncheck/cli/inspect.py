"""`attncheck inspect`: one head of one layer walked by hand, every printed number beside its recomputation."""
from __future__ import annotations

import sys

import click

from ..report import EXIT_INPUT, EXIT_UNVERIFIED
from ..arch.context import opened
from ..errors import DumpError, ModelError
from .common import (SCALE, combine, console as make_console, fail, html_option, json_option, tokens as parse_tokens,
                     vocab, write_html, write_json)


@click.command(name="inspect")
@click.argument("dump")
@click.option("--layer", type=int, required=True, help="The layer to walk.")
@click.option("--head", type=int, required=True, help="The query head to walk.")
@click.option("--query", type=int, help="Query index in the evaluation (default: the last whose visible slots are "
                                          "all printed).")
@click.option("--eval", "evaluation", type=int, default=0, show_default=True, help="Evaluation (ubatch) index.")
@click.option("--kq-scale", type=SCALE, help="The scale SOFT_MAX applied to kq (default 1/sqrt(D_h)).")
@json_option("the walk as JSON (schema 1)")
@click.option("--model", metavar="GGUF", help="Also show the query's full rows (every dim and visible slot) from "
                                              "this model's reference forward pass, and check them.")
@click.option("--tokens", metavar="IDS", help="The prompt's token ids, e.g. 1,2,3, for logs that do not print them.")
@html_option("the walk and the head's heatmaps")
def inspect_(dump, layer, head, query, evaluation, kq_scale, json_out, model, tokens, html_out):
    """Walk one head by hand: Q/K/V rows, scores, scale, mask, weights, weighted sum, beside the dump."""
    from ..inspect import inspect as walk_one
    from ..inspect.inspection import Inspection
    from ..inspect.walk import NothingToInspect

    page, context = None, opened(model)  # its header read once: for the walk, its checks and the page's vocabulary
    try:
        if html_out:
            from ..inspect.html import head_page

            w, mw, page = head_page(dump, layer, head, query=query, evaluation=evaluation, kq_scale=kq_scale,
                                    model=context, tokens=parse_tokens(tokens), vocab=vocab(context))
            seen = Inspection(w, mw)
        else:  # a flash-attention dump with --model: the head walked from the reference, the flash output checked
            seen = walk_one(dump, layer, head, query=query, evaluation=evaluation, kq_scale=kq_scale, model=context,
                            tokens=parse_tokens(tokens))
    except (DumpError, ModelError) as e:
        fail(str(e))
        sys.exit(EXIT_INPUT)
    except NothingToInspect as e:
        fail(str(e) + (" (--html shows flash attention with check --html --model)" if html_out and model else ""))
        sys.exit(EXIT_UNVERIFIED)
    except Exception as e:  # a bug: still one line, still exit 2
        fail(f"{dump}: internal error ({type(e).__name__}: {e}); please report it with the dump")
        sys.exit(EXIT_INPUT)
    if json_out != "-":
        console = make_console()  # under NO_COLOR no escapes at all: shades and numbers carry the heatmap
        if seen.flash is not None:
            from ..inspect.flash import render_flash

            render_flash(seen.flash, seen.model, console)
        else:
            from ..inspect.render import render_walk

            render_walk(seen.walk, console)
            if seen.model is not None:
                from ..inspect.render_model import render_model_walk

                render_model_walk(seen.walk, seen.model, console)
    codes = [seen.exit_code]
    if json_out:
        codes.append(write_json(seen.to_dict(), json_out))
    if page is not None:
        codes.append(write_html(html_out, lambda: page))
    sys.exit(combine(codes))
