"""compare_value (one whole-tensor value, in Python floats) gives what compare gives on a one-element array, for every
double: NaN, ±inf, ±0, subnormals, bounds of 0 and below, with and without --atol/--rtol.

A property of two functions of numbers, not of a dump: no dump prints the NaN bounds or negative zeros drawn here,
and the real dumps' `sum =` lines go through both paths in the other tests (test_dumps, test_properties)."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from attncheck.dump.records import Node
from attncheck.results import FixedTolerance, compare, compare_value

NODE = Node("kq_soft_max-0", "f32", "SOFT_MAX", (None, None), (4, 2, 2, 1), 7, b"", 8)
ANY = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)
SPECIAL = st.sampled_from([0.0, -0.0, 1.0, -1.0, 4.0, 5e-7, math.inf, -math.inf, math.nan, 5e-324])
VALUE = st.one_of(ANY, SPECIAL)


def _fields(res):
    """The result as comparable values (NaN as a string: NaN never equals itself)."""
    out = []
    for name in res.__slots__:
        v = getattr(res, name)
        out.append((name, repr(v) if isinstance(v, (float, list)) else v))
    return out


@settings(max_examples=600)
@given(got=VALUE, want=VALUE, bound=VALUE, tol=st.none() | st.tuples(SPECIAL, SPECIAL))
def test_compare_value_is_compare_of_one_element(got, want, bound, tol):
    tol = None if tol is None else FixedTolerance(*tol)
    with np.errstate(all="ignore"):  # --rtol 0 of an inf: numpy's warning, Python's silent NaN
        one = compare("sum", NODE, [got], [want], [bound], lambda i: None, note="n", tol=tol)
    assert _fields(compare_value("sum", NODE, got, want, bound, note="n", tol=tol)) == _fields(one)


def test_compare_value_fails_what_it_should():
    """Beyond the bound, NaN and inf fail; within it passes (so that the property above cannot hold vacuously)."""
    assert compare_value("sum", NODE, 4.0, 4.0, 0.0).passed
    assert compare_value("sum", NODE, 4.0000004, 4.0, 5e-7).passed
    for got in (4.1, math.nan, math.inf):
        res = compare_value("sum", NODE, got, 4.0, 5e-7)
        assert not res.passed and res.failed == 1 and res.failures[0].at is None
