"""attncheck: verify llama.cpp attention from llama-eval-callback dumps.

    >>> import attncheck
    >>> report = attncheck.verify(attncheck.read_dump("dump.txt"))
    >>> report.exit_code, report.totals()["softmax_rows_checked"]
"""
__version__ = "0.1.0"

from .errors import DumpError
from .dump.graph import Dump, read_dump
from .check.report import Report
from .verify import Options, verify

__all__ = ["DumpError", "Dump", "Options", "Report", "read_dump", "verify", "__version__"]
