"""What attncheck knows of each llama.cpp architecture, in one place, as data per architecture (the way llama.cpp
keeps load_hparams per architecture in src/models/<arch>.cpp). Nothing else in the package branches on an
architecture's name: it asks `lookup(name)` for the entry and reads its fields.
"""
from .facts import AttentionFacts, Fact, Window
from .table import ARCHS, Arch, Attention, Forward, lookup

__all__ = ["ARCHS", "Arch", "Attention", "AttentionFacts", "Fact", "Forward", "Window", "lookup"]
