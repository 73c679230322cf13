"""attncheck: verify llama.cpp attention from llama-eval-callback dumps.

One function per command, each returning the object its JSON is made from (`.to_dict()`, `.exit_code`; list: the
dict of one dump), raising DumpError or ModelError where the command exits 2:

    >>> import attncheck
    >>> report = attncheck.verify("dump.txt")                       # attncheck check dump.txt
    >>> report = attncheck.verify("dump.txt", model="model.gguf")   # attncheck check dump.txt --model model.gguf
    >>> report.exit_code, report.totals()["softmax_rows_checked"]
    >>> rep = attncheck.diff("old.txt", "new.txt")                  # attncheck diff old.txt new.txt
    >>> head = attncheck.inspect("dump.txt", layer=0, head=3)       # attncheck inspect dump.txt --layer 0 --head 3
    >>> listed = attncheck.list_dump("dump.txt")                    # attncheck list dump.txt --json (one dump)
    >>> report = attncheck.run("model.gguf", "How are", ["-ub", "2"])  # attncheck run -m model.gguf -p ... -- -ub 2

`attncheck.diff` and `attncheck.inspect` are also the packages that hold those commands (commands.py); `attncheck.run`
is cli/llama.py's run_llama.
"""
__version__ = "0.1.0"

import os as _os

# The --model reference multiplies small matrices (a prompt's rows by one weight); BLAS threads only contend, above all
# with llama.cpp itself in `llama-eval-callback | attncheck` (measured: 27× slower on 2 busy cores). One thread, unless
# the user chose otherwise; set before numpy loads its BLAS.
_os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from .errors import DumpError, ModelError
from .dump.graph import Dump, read_dump
from .report import Report
from .verify import Options, verify
from .listing import list_dump
from . import diff, inspect
from .cli.llama import run_llama as run

__all__ = ["DumpError", "Dump", "ModelError", "Options", "Report", "diff", "inspect", "list_dump", "read_dump", "run",
           "verify", "__version__"]
