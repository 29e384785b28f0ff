"""Attention implementations, selected by name through a torch-free registry.

Importing this package does not import torch; the implementations themselves are imported
only when `get(name)` is called.
"""

from cs336sys.attention.registry import get, names, register

__all__ = ["get", "names", "register"]
