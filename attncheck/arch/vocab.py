"""Token ids → their text, from a GGUF header's vocabulary (tokenizer.ggml.tokens, which gguf_header.py keeps).

Vocabulary entries are stored in the tokenizer's own spelling: byte-level BPE (tokenizer.ggml.model "gpt2") maps each
byte to a printable character (a space is "Ġ", a newline "Ċ"); SentencePiece ("llama") writes a space as "▁" and a
byte it has no piece for as "<0x0A>". `token_text` undoes that, so a token reads as the text it stands for."""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Mapping, Sequence

_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
# A space that neither a table cell nor a line breaks at (rich wraps at any Unicode space): a private-use character,
# which shown() never lets through from the input (repr escapes it), written as a space by the console's render hook
# (cli/common.py). A token's text is one unit on the screen: `357 ' it'` never wraps to `357 '` / `it'`.
GLUE = "\ue000"


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level BPE alphabet: each byte → the printable character that spells it in the vocabulary."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """bytes_to_unicode, inverted: the printable character of each byte → the byte."""
    return {c: b for b, c in bytes_to_unicode().items()}


def _decode(piece: str, model: str | None) -> str:
    if model == "gpt2":
        table = _byte_decoder()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece).decode("utf-8", "replace")
        return piece
    if model in ("llama", "t5", "gemma4") or "▁" in piece:
        m = _BYTE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)]).decode("utf-8", "replace")
        return piece.replace("▁", " ")
    return piece


class Texts(Sequence[str]):
    """A vocabulary read as text: entry i is token i's text, decoded when asked for (a page shows a few dozen of
    a vocabulary of 50,000 or more)."""

    def __init__(self, pieces: Sequence[str], model: str | None):
        self.pieces, self.model = pieces, model

    def __len__(self) -> int:
        return len(self.pieces)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [_decode(p, self.model) for p in self.pieces[i]]
        return _decode(self.pieces[i], self.model)


def token_text(meta: Mapping[str, Any], ids: Sequence[int] | None) -> list[str] | None:
    """The text of each token id (None when the header has no vocabulary or no ids were given); an id outside the
    vocabulary reads "<id N?>"."""
    vocab = meta.get("tokenizer.ggml.tokens")
    if ids is None or vocab is None or isinstance(vocab, int):
        return None
    model = meta.get("tokenizer.ggml.model")
    return [_decode(vocab[i], model) if 0 <= i < len(vocab) else f"<id {i}?>" for i in ids]


def shown(text: str, markup: bool = False) -> str:
    """A token's text for a table: quoted, control characters escaped ("\\n"), its spaces glued (GLUE), so that it
    stays on one line and whole; markup: its square brackets escaped for rich markup (errors.markup would escape
    the glue)."""
    out = repr(text).replace(" ", GLUE)
    if markup:
        from rich.markup import escape

        out = escape(out)
    return out


def token_unit(token: int, text: str | None, markup: bool = False) -> str:
    """`357 ' it'`: a token id and its text as one unit of a line (glued: never broken across lines)."""
    return str(token) if text is None else f"{token}{GLUE}{shown(text, markup)}"
