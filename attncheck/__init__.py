"""attncheck: verify llama.cpp attention from llama-eval-callback dumps.

    >>> import attncheck
    >>> report = attncheck.verify(attncheck.read_dump("dump.txt"))
    >>> report.exit_code, report.totals()["softmax_rows_checked"]
"""
__version__ = "0.1.0"

import os as _os

# The --model reference multiplies small matrices (a prompt's rows by one weight); BLAS threads only contend, above all
# with llama.cpp itself in `llama-eval-callback | attncheck` (measured: 27× slower on 2 busy cores). One thread, unless
# the user chose otherwise; set before numpy loads its BLAS.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .errors import DumpError
from .dump.graph import Dump, read_dump
from .check.report import Report
from .verify import Options, verify

__all__ = ["DumpError", "Dump", "Options", "Report", "read_dump", "verify", "__version__"]
