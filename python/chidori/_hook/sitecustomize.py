"""Interpreter-start hook of ``chidori run --optimize``: turns on server-side decode for an
unmodified script.

``chidori run --optimize`` puts this directory first on PYTHONPATH, so Python imports this
module as ``sitecustomize`` at start-up. It first runs the ``sitecustomize`` it shadows (the
environment's own, if any), then calls :func:`chidori.decode.optimize`.
"""
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

try:
    from chidori import decode as _decode

    _decode.optimize()
except Exception as error:  # noqa: BLE001 - never stop the program from starting
    print(f"chidori: --optimize could not be turned on: {error!r}", file=sys.stderr)
