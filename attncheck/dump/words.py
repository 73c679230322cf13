"""The printed numbers of many node bodies as floats, in one pass of numpy over their text (sample.py's
parse_samples): which words are prints it can vouch for, and their values, bit for bit what float() gives."""
from __future__ import annotations

import numpy as np

# per byte: 0 what splits words (whitespace as bytes.split takes it, and the brackets, commas and '=' that
# parse_sample turns into spaces), 1 a digit, 2 '.', 3 '-', 4 any other byte
_CLASSES = bytes(0 if c in b" \t\n\r\x0b\x0c[],=" else 1 if c in b"0123456789" else 2 if c == ord(".")
                 else 3 if c == ord("-") else 4 for c in range(256))
_CLASS = np.frombuffer(_CLASSES, np.int8)  # the same, looked up by numpy
_WORD = bytes(c != 0 for c in _CLASSES)  # per byte: 1 when in a word (read as a bool)
_VALUE = np.array([c - ord("0") if c in b"0123456789" else 0 for c in range(256)], np.uint8)  # a digit's value, else 0
# a word's code: the sum over its bytes counts its '.' (units), '-' (64s) and other bytes (4096s), digits nothing;
# unambiguous for words of at most _LONGEST bytes
_CODE = np.array([0, 0, 1, 64, 4096], np.int64)
_LONGEST = 48  # bytes: 47 for the longest %f print (39 digits, '.', 6 decimals, '-')
_POW10 = np.array([float(10 ** k) for k in range(64)])  # exact up to 10^22, correctly rounded past it
_EXACT_DIGITS = 15  # a mantissa of at most 15 digits is an exact double, and so is its sum of digit * 10^k


def words_as_floats(bodies: list[bytes]) -> tuple[np.ndarray, list[int], np.ndarray]:
    """The words of each body, as parse_sample splits it, as floats (one array for all), the number of words of
    each body, and the running count of the words that are `%12.4f` or `%f` prints of a finite number (-?D.DDDD, 1
    to 39 digits before the point, 4 or 6 after: what sample.py's _PRINTED_VALUES accepts, but nan and inf) of at
    most 15 digits: for those, float(word) is the exact quotient of two exact doubles, mantissa / 10^decimals, which
    IEEE division rounds as float() does. The words parse_sample removes, `...` and `sum`, are left out when they
    stand alone; within another word they make it one this pass does not accept. Most words are `%12.4f` prints of
    less than 1000 in magnitude, read by their bytes' places from the word's end (_short); the rest byte by byte."""
    # _SHORT blanks before (a short word's places are all in the text), one between bodies and after: one copy
    joined = b" ".join([b" " * (_SHORT - 1), *bodies, b""])
    word = np.frombuffer(joined.translate(_WORD), np.bool_)
    # where a word starts and where the blanks after it start, in turn: `joined` starts and ends with a blank
    edges = np.flatnonzero(word[:-1] != word[1:]) + 1
    starts = edges[0::2]
    length = edges[1::2] - starts
    raw = np.frombuffer(joined, np.uint8)
    values = np.zeros(len(starts))
    good = np.zeros(len(starts), bool)
    short = np.flatnonzero((length >= 6) & (length <= _SHORT))
    values[short], good[short] = _short(joined, starts[short] + length[short] - 1, length[short])
    three = np.flatnonzero(length == 3)
    a, b, c = (raw[starts[three] + k] for k in range(3))
    dropped = np.zeros(len(starts), bool)
    dropped[three] = ((a == ord(".")) & (b == ord(".")) & (c == ord("."))) | \
        ((a == ord("s")) & (b == ord("u")) & (c == ord("m")))
    rest = np.flatnonzero(~good & ~dropped)
    values[rest], good[rest] = _any_words(raw, starts[rest], length[rest])
    keep = ~dropped
    bounds = np.cumsum([_SHORT] + [len(b) + 1 for b in bodies])  # each body's first byte in `joined`
    words = np.diff(np.searchsorted(starts[keep], bounds)).tolist()
    return values[keep], words, np.concatenate(([0], np.cumsum(good[keep])))


_SHORT = 8  # bytes: the longest word _short reads (-999.9999), and the places of the window it reads each in
# A word's window: its last 8 bytes (those before it for a shorter one) as a little-endian uint64, place 7 its last
# byte, place 3 its '.'. XORed with _ZEROS, a digit's place holds its value (0-9) and any other byte's 10 or more,
# which adding _TENS to the low 7 bits of each place (no carry out of it) marks in the place's high bit.
_ZEROS, _LOW7, _TENS, _HIGH = (np.uint64(int.from_bytes(bytes([b]) * 8, "little")) for b in (0x30, 0x7F, 0x76, 0x80))
_DOT = np.uint64(ord(".") << 24)
_PLACE = np.uint64(0xFF)
_FIRST = np.array([0, 0, 0, 0, 0, 0, 16, 8, 0], np.uint64)  # by length: the bit its first byte starts at
_INSIDE = np.array([0] * 6 + [(1 << 64) - (1 << b) for b in (16, 8, 0)], np.uint64)  # by length: its places
_DIGITS_AT = _INSIDE & np.uint64(int.from_bytes(bytes([0x80, 0x80, 0x80, 0, 0x80, 0x80, 0x80, 0x80]), "little"))
_BEFORE, _AFTER = np.uint64(0xFFFFFF), np.uint64(0xFFFFFFFF << 32)  # places 0-2 (before the '.'), 4-7 (after)
_PAIRS = np.uint64(0x000000FF000000FF)  # places 0 and 4
_BY_100, _BY_1 = np.uint64(100 + (1000000 << 32)), np.uint64(1 + (10000 << 32))  # pairs 0, 4 and 2, 6 to their powers


def _short(joined: bytes, last: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Words of 6 to _SHORT bytes ending at `last`: whether each is -?D+.DDDD, and the value of each that is (its
    mantissa, an exact integer, over 10^4, as _any_words computes it; the others' are no value, and are read again
    there). Each word's window is read in one unaligned load, and its places tested all at once."""
    windows = np.ndarray((len(joined) - 7,), "<u8", joined, strides=(1,))  # [bytes - 7] 8 bytes from each byte on
    w = windows[last - 7]
    x = w ^ _ZEROS
    other = (((x & _LOW7) + _TENS) | x) & _HIGH  # a place's high bit: not a digit
    first = _FIRST[length]
    minus = (length > 6) & ((w >> first) & _PLACE == ord("-"))  # '-' first: one digit fewer before '.'
    need = _DIGITS_AT[length] & ~(minus.astype(np.uint64) << (first + np.uint64(7)))  # the places digits must be in
    ok = (w & (_PLACE << np.uint64(24)) == _DOT) & (other & need == 0)
    digits = x & ((need >> np.uint64(7)) * _PLACE)  # where ok, each digit's value in its place and 0 elsewhere
    # the places before the '.' moved up one over it: an 8-digit number, place 0 its highest, the word's mantissa;
    # summed in three steps of pairs (SWAR: each step's sums fit their places, so nothing carries between them)
    m = ((digits & _BEFORE) << np.uint64(8)) | (digits & _AFTER)
    m = m * np.uint64(10) + (m >> np.uint64(8))  # places 0, 2, 4, 6: two digits' value
    m = ((m & _PAIRS) * _BY_100 + ((m >> np.uint64(16)) & _PAIRS) * _BY_1) >> np.uint64(32)
    values = m.astype(np.float64) / 1e4
    np.negative(values, out=values, where=minus)
    return values, ok


def _any_words(raw: np.ndarray, starts: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Words of any kind, byte by byte: each one's value, and whether it is a print words_as_floats accepts."""
    if not len(starts):
        return np.zeros(0), np.zeros(0, bool)
    first = np.cumsum(length) - length  # each word's first byte among their bytes run together
    at = np.arange(int(length.sum()))
    inside = np.repeat(starts - first, length) + at  # each of those bytes' place in `joined`
    c = _CLASS[raw[inside]]
    code = np.add.reduceat(_CODE[c], first)
    dots, minus = code % 64, code // 64 % 64
    dot = np.flatnonzero(c == 2)
    # where a word's '.' is (with one '.': the one after the dots of the words before it; else any place)
    dot_at = dot[np.minimum(np.cumsum(dots) - dots, len(dot) - 1)] if len(dot) else first
    last = first + length - 1
    decimals = last - dot_at
    good = ((code < 4096) & (dots == 1) & (minus == (c[first] == 3)) & (length <= _LONGEST)
            & (dot_at - first - minus >= 1) & ((decimals == 4) | (decimals == 6))
            & (length - 1 - minus <= _EXACT_DIGITS))
    # each digit's power of ten in its word's mantissa: the digits after it, the '.' not counted
    power = np.repeat(last, length) - at - (at < np.repeat(dot_at, length))
    digit = _VALUE[raw[inside]]
    mantissa = np.add.reduceat(digit * _POW10[np.clip(power, 0, len(_POW10) - 1)], first)
    values = mantissa / _POW10[np.clip(decimals, 0, len(_POW10) - 1)]
    np.negative(values, out=values, where=minus > 0)
    return values, good
