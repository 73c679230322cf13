"""A 2024 log's model header → the GGUF metadata it prints, for facts_from_header(meta, origin="log").

llama.cpp's model loader printed every GGUF key while loading (today's eval-callback no longer does):

    llama_model_loader: - kv   9:                          llama.block_count u32              = 30
    llama_model_loader: - kv   8:                          general.languages arr[str,1]       = ["en"]
    llama_model_loader: - type q4_1:  210 tensors

A value longer than 40 characters was cut to 37 and `...` (llama_model_loader's MAX_VALUE_LEN): such a value, and
any array the print cut, is left out rather than guessed. The `- type` lines give how many tensors of each ggml
type the file holds (the weights' types, which the drift model of `attncheck diff` reads).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from .gguf_keys import bad_keys

_KV = re.compile(r"llama_model_loader: - kv +\d+: +(?P<key>\S+) +(?P<type>arr\[\w+,\d+\]|\w+) += ?(?P<value>.*)$")
_TYPE = re.compile(r"llama_model_loader: - type +(?P<type>\w+): +(?P<n>\d+) tensors")
_ARRAY = re.compile(r"arr\[(?P<elem>\w+),(?P<n>\d+)\]")
_INTS = ("u8", "i8", "u16", "i16", "u32", "i32", "u64", "i64")
_FLOATS = ("f32", "f64")
MAX_VALUE_LEN = 40  # llama_model_loader cuts longer values to 37 characters and "..."


@dataclass
class LogHeader:
    """What a log printed of its model: GGUF key → value (cut values left out), tensor counts per ggml type."""

    line: int  # the first `llama_model_loader:` line
    meta: dict[str, Any] = field(default_factory=dict)
    tensor_types: dict[str, int] = field(default_factory=dict)
    cut: list[str] = field(default_factory=list)  # keys whose printed value was cut

    @property
    def arch(self) -> str | None:
        return self.meta.get("general.architecture")


def _scalar(kind: str, text: str) -> Any:
    if kind in _INTS:
        return int(text)
    if kind in _FLOATS:
        return float(text)
    if kind == "bool":
        return {"true": True, "false": False}[text]
    return text


def _value(kind: str, text: str) -> Any:
    """The printed value as Python; ValueError when it was cut or does not parse."""
    text = text.rstrip("\r")
    if len(text) >= MAX_VALUE_LEN and text.endswith("..."):
        raise ValueError("cut")
    arr = _ARRAY.fullmatch(kind)
    if arr is None:
        return _scalar(kind, text.strip() if kind != "str" else text)
    items = json.loads(text) if arr["elem"] == "str" else [_scalar(arr["elem"], x.strip())
                                                           for x in text.strip()[1:-1].split(",") if x.strip()]
    if not text.strip().startswith("[") or len(items) != int(arr["n"]):
        raise ValueError("cut")
    return items


def parse_log_header(text: str, first_line: int = 1) -> LogHeader | None:
    """The model header printed in a stretch of log text (None when it holds no `- kv` line)."""
    header: LogHeader | None = None
    for i, raw in enumerate(text.splitlines()):
        m = _KV.search(raw)
        t = None if m else _TYPE.search(raw)
        if m is None and t is None:
            continue
        if header is None:
            header = LogHeader(first_line + i)
        if t is not None:
            header.tensor_types[t["type"]] = header.tensor_types.get(t["type"], 0) + int(t["n"])
            continue
        try:
            header.meta[m["key"]] = _value(m["type"], m["value"])
        except (ValueError, KeyError, json.JSONDecodeError):
            header.cut.append(m["key"])
    if header is not None:  # a value llama.cpp would not load (block_count 2^40, a NaN epsilon) is left out too
        for key, _ in list(bad_keys(header.meta)):
            header.meta.pop(key, None)
            header.cut.append(key)
    return header if header is not None and header.meta else None
