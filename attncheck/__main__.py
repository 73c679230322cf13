"""`python -m attncheck` is the `attncheck` command."""
from .cli import entry

entry()
