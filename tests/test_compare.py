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
from attncheck.results import Tolerance, compare, compare_value

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
    tol = None if tol is None else Tolerance(*tol)
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
    # an infinite error never passes, not even under the infinite bound --rtol gives an inf
    for got, want in ((math.inf, math.inf), (1.0, math.inf), (-math.inf, math.inf)):
        assert not compare_value("sum", NODE, got, want, 0.0, tol=Tolerance(0.0, 1.0)).passed
        with np.errstate(all="ignore"):
            assert not compare("sum", NODE, [got], [want], [0.0], lambda i: None, tol=Tolerance(0.0, 1.0)).passed


# ---- one kernel: check's compare and diff's measure hold elements to the same pass rule ------------------------------

GRID = st.integers(-64, 64).map(lambda k: k / 8)  # values on a grid: no error lands within diff's 1e-12 parsing slack


@settings(max_examples=300)
@given(old=st.lists(GRID, min_size=1, max_size=12), moves=st.lists(GRID, min_size=12, max_size=12),
       atol=st.integers(0, 8).map(lambda k: k / 16))
def test_diff_and_check_apply_one_pass_rule(old, moves, atol):
    """A diff held to atol alone (no drift allowance) fails exactly the elements compare() fails with that bound, and
    needs the same factor: both go through results.abs_error/within/needed, not pass rules of their own."""
    from attncheck.diff.align import Aligned
    from attncheck.diff.measure import measure
    from attncheck.diff.nodes import DiffTolerance, NodeDiff
    from attncheck.dump.roles import Role

    a = np.array(old)
    b = a + np.array(moves[:len(a)])
    tol = DiffTolerance(atol, 0.0, origin="--atol/--rtol", drift=False)
    nd = NodeDiff(0, 0, Role("layer", 0, "kq", "role"), None, None)  # type: ignore[arg-type]
    measure(nd, Aligned("index", np.zeros((len(a), 4), np.int64), a, b, ("", "", "", "")), tol)
    res = compare("kq", NODE, b, a, tol.bound(np.maximum(np.abs(a), np.abs(b))), lambda i: None)
    assert (nd.failed, nd.ratio) == (res.failed, res.ratio)
    assert res.failed == int(np.count_nonzero(np.abs(b - a) > atol))  # the rule itself, not only agreement
