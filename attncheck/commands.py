"""Packages that are also functions: `attncheck.diff(old, new)` and `attncheck.inspect(dump, layer, head)` are the
commands `attncheck diff` and `attncheck inspect` for Python, while `attncheck.diff.compare`, `attncheck.inspect.walk` and the rest stay the modules they are. A package's name
is bound to the package whenever one of its modules is imported, so a function of the same name beside it would be
replaced at the first call; a package module whose class is callable is both."""
from __future__ import annotations

import sys
import types
from typing import Callable


class CommandModule(types.ModuleType):
    """A module that calls its `__command__` when called."""

    def __call__(self, *args, **kwargs):
        return self.__command__(*args, **kwargs)


def callable_module(name: str, command: Callable) -> None:
    """Make the module `name` (a package's __init__ or a module, by its __name__) call `command` when called."""
    module = sys.modules[name]
    module.__command__ = command
    module.__class__ = CommandModule
