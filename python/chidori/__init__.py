"""Chidori: run CUDA programs on a GPU in another machine (``chidori run -s HOST -- ...``).

Server-side decode: :func:`optimize` and :func:`server_decode` (see :mod:`chidori.decode`).
"""
from .decode import optimize, server_decode

__all__ = ["optimize", "server_decode"]
