"""Interpreter-start hook of ``chidori run --optimize`` and ``chidori run --trace``.

Either option puts this directory first on PYTHONPATH, so Python imports this module as
``sitecustomize`` at start-up. It first runs the ``sitecustomize`` it shadows (the
environment's own, if any); then, with ``--optimize`` (CHIDORI_OPTIMIZE=1), turns on
server-side decode (:func:`chidori.decode.optimize`), and with ``--trace`` (CHIDORI_TRACE
set) has Chidori's client library follow Python frames, so that round trips waited while
an extension released the interpreter (torch does around every operator) are placed at
the script's own lines. A profiler the environment installed is left alone.
"""
import ctypes
import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


try:
    _run_shadowed()
except Exception as error:  # noqa: BLE001 - the environment's hook failing is its own business
    print(f"chidori: the environment's sitecustomize failed: {error!r}", file=sys.stderr)

if os.environ.get("CHIDORI_TRACE") and sys.getprofile() is None:
    try:
        # PyDLL: the call keeps the interpreter, as setting a profile function requires.
        ctypes.PyDLL(None).chidori_trace_python()
    except (OSError, AttributeError) as error:
        print(f"chidori: --trace cannot follow Python frames: {error!r}", file=sys.stderr)

if os.environ.get("CHIDORI_OPTIMIZE") == "1":
    try:
        from chidori import decode as _decode

        _decode.optimize()
    except Exception as error:  # noqa: BLE001 - never stop the program from starting
        print(f"chidori: --optimize could not be turned on: {error!r}", file=sys.stderr)
