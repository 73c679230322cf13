"""How exact the dumped numbers are (docs/format.md §6): the terms every per-element bound is built from
(docs/numerics.md §1)."""
from __future__ import annotations

PRINT = 5e-5  # `%12.4f`: a printed value is within half a unit of the 4th decimal of the stored one
SUM_PRINT = 5e-7  # `sum = %f`
F32 = 2.0**-24  # unit roundoff of f32 arithmetic (accumulations, expf)

# On the CPU, MUL_MAT with an f16 (bf16) src0 converts src1 to f16 (bf16) first: P is rounded before P·V.
SRC1_ROUNDING = {"f32": 0.0, "f16": 2.0**-11, "bf16": 2.0**-8}


def sum_bound(n_added: int, magnitude: float, n_rows: int = 0, row_len: int = 0) -> float:
    """|printed sum − exact sum|: f32 accumulation of n_added non-zero terms, row normalisation, the `%f` print."""
    return n_added * F32 * magnitude + n_rows * (row_len + 4) * F32 + SUM_PRINT
