"""Chidori: run unmodified CUDA programs on a GPU in another machine.

Installing this package gives the ``chidori`` command (``chidori serve`` on the GPU
machine, ``chidori run -s HOST -- python train.py`` on yours) and, for programs that run
under ``chidori run``, a few questions they can ask about it::

    import chidori

    if chidori.is_remote():
        print("CUDA runs on", chidori.server())
        print(chidori.stats()["total"])

Nothing here needs torch, a GPU or a server: outside ``chidori run`` the answers are
``False``, ``None`` and ``{}``.

Server-side decode (:mod:`chidori.decode`): :func:`optimize` makes Hugging Face
``generate`` run its token loop on the server; :func:`server_decode` generates a completion
of a prompt that way.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union

from chidori._find import find_binary, lib_dir, profiles_dir
from chidori.decode import fast_generate, optimize, server_decode

__all__ = [
    "CallStats",
    "DEFAULT_PORT",
    "WaitSite",
    "__version__",
    "fast_generate",
    "find_binary",
    "is_remote",
    "lib_dir",
    "optimize",
    "profiles_dir",
    "server",
    "server_decode",
    "stats",
    "waits",
]

#: The port ``chidori serve`` listens on unless told otherwise.
DEFAULT_PORT = 43211

#: One function's counts, as :func:`stats` returns them: ``calls``, ``round_trips``,
#: ``bytes_sent``, ``bytes_received`` (integers) and ``ms_waiting`` (a float).
CallStats = Dict[str, Union[int, float]]

#: The environment variable ``chidori run -s HOST`` sets for the program.
_SERVER_ENV = "CHIDORI_SERVER"

#: The function libchidori.so exports for :func:`stats`.
_STATS_SYMBOL = "chidori_stats_json"


def _read_version() -> str:
    """This release's version: the workspace ``version`` of Chidori's ``Cargo.toml``.

    An installed package has it in its metadata (maturin writes it there from
    ``Cargo.toml``); in a checkout (``python/chidori`` of the repository) it is read from
    the file.
    """
    package = Path(__file__).resolve().parent
    checkout = package.parent.parent
    cargo_toml = checkout / "Cargo.toml"
    if package.parent.name == "python" and (checkout / "interposer").is_dir() and cargo_toml.is_file():
        match = re.search(
            r'^\[workspace\.package\][^\[]*?^version\s*=\s*"([^"]+)"',
            cargo_toml.read_text(encoding="utf-8"),
            re.MULTILINE | re.DOTALL,
        )
        if match:
            return match.group(1)
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return "0+unknown"
    try:
        return version("chidori")
    except PackageNotFoundError:
        return "0+unknown"


__version__: str = _read_version()


@functools.lru_cache(maxsize=None)
def _stats_function() -> Optional[Callable[..., int]]:
    """``chidori_stats_json`` of the libchidori.so loaded in this process, if there is one.

    ``chidori run`` preloads the shim libraries, which load libchidori.so into the
    process's global scope, so the running program (``dlopen(NULL)``) finds it.
    """
    try:
        process = ctypes.CDLL(None)
        function = getattr(process, _STATS_SYMBOL)
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    function.restype = ctypes.c_size_t
    stats_json: Callable[..., int] = function
    return stats_json


def is_remote() -> bool:
    """Whether this process runs under ``chidori run``: its CUDA calls go to a server.

    True when ``CHIDORI_SERVER`` is set and Chidori's client library is loaded in the
    process (the variable alone can be inherited by a process that does not preload it).
    """
    return bool(os.environ.get(_SERVER_ENV)) and _stats_function() is not None


def server() -> Optional[str]:
    """The server this process's CUDA calls go to, as ``HOST:PORT``; None when not remote."""
    if not is_remote():
        return None
    address = os.environ[_SERVER_ENV]
    # As the client library reads it: a port after the last colon, else the default one.
    _, colon, port = address.rpartition(":")
    has_port = bool(colon) and re.fullmatch(r"\+?[0-9]+", port) is not None and int(port) <= 0xFFFF
    return address if has_port else f"{address}:{DEFAULT_PORT}"


def _stats_document() -> Dict[str, Any]:
    """The JSON document ``chidori_stats_json`` writes, decoded; empty when not remote."""
    if not os.environ.get(_SERVER_ENV):
        return {}
    function = _stats_function()
    if function is None:
        return {}
    # The function returns the length the JSON needs and writes it only when it fits; the
    # counts may grow between two calls, so ask with room to spare, and again if needed.
    length = int(function(None, 0))
    while True:
        if length == 0:
            return {}  # An internal error of the client library (it logged it).
        buffer = ctypes.create_string_buffer(length + 4096)
        length = int(function(buffer, len(buffer)))
        if length <= len(buffer):
            break
    decoded: Dict[str, Any] = json.loads(buffer.raw[:length].decode("utf-8"))
    return decoded


def stats() -> Dict[str, CallStats]:
    """Calls, round trips, bytes each way and time waiting so far, per CUDA function.

    Returns a dict from function name (``"cudaMemcpy"``, and a few of Chidori's own rows
    such as ``"(module load)"`` or ``"(kernel launch)"``) to its :data:`CallStats`, plus the
    key ``"total"`` with the sums. Variants of one function share a row. Empty when this
    process is not remote (see :func:`is_remote`).

    The numbers are the ones ``chidori run --trace`` prints at exit.
    """
    decoded = _stats_document()
    if not decoded:
        return {}
    result: Dict[str, CallStats] = dict(decoded["functions"])
    result["total"] = decoded["total"]
    return result


#: One place where the program waited, as :func:`waits` returns it: ``where``
#: (``"train.py:57"``, or a native object), ``in`` (the function), ``source`` (the line's
#: text, Python only), ``round_trips``, ``ms_waiting`` and ``waited_for`` (the CUDA function
#: that waited most there).
WaitSite = Dict[str, Union[str, int, float]]


def waits() -> List[WaitSite]:
    """Where this program made the round trips it waited for, most waiting first.

    Filled only while tracing (``chidori run --trace``, which prints the same table at
    exit); empty otherwise, and when this process is not remote.
    """
    sites: List[WaitSite] = list(_stats_document().get("sources", []))
    return sites
