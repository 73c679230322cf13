"""`python -m attncheck` is the `attncheck` command."""
from .cli import main

main()
