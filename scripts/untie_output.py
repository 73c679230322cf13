#!/usr/bin/env python3
"""Copy a GGUF model, adding `output.weight` as a copy of `token_embd.weight` (the tied output projection spelled
out), so that llama.cpp builds that require the tensor load the model.

    python3 scripts/untie_output.py IN.gguf OUT.gguf

The 2024 llama.cpp (llama-cpp-python 0.2.90) refuses a gpt2 or bloom model without `output.weight`
("check_tensor_dims: tensor 'output.weight' not found"); today's falls back to the token embeddings, so both
builds compute the same logits from the copy. Everything else (metadata, tensors, their types and bytes) is kept.
"""
from __future__ import annotations

import sys

import gguf


def untie(src: str, dst: str) -> None:
    r = gguf.GGUFReader(src)
    names = {t.name for t in r.tensors}
    if "output.weight" in names:
        raise SystemExit(f"{src}: already has output.weight")
    if "token_embd.weight" not in names:
        raise SystemExit(f"{src}: no token_embd.weight to copy")
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(dst, arch)
    for name, field in r.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, field.contents(), vtype, sub_type=sub)
    for t in r.tensors:
        shape = list(reversed([int(x) for x in t.shape]))  # GGUFReader gives ne order; raw_shape is numpy order
        w.add_tensor(t.name, t.data, raw_shape=shape, raw_dtype=t.tensor_type)
        if t.name == "token_embd.weight":
            w.add_tensor("output.weight", t.data, raw_shape=shape, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[2].strip())
    untie(sys.argv[1], sys.argv[2])
