"""Where the files of an installed Chidori are: the ``chidori`` binary, the client
libraries and the device profiles.

pip puts the binary in the scheme's ``scripts`` directory (``<venv>/bin``,
``~/.local/bin``, ``DIR/bin`` for ``pip install --target DIR``) and the package, with the
libraries inside it, in ``site-packages``. The ``chidori`` binary makes the same search
from its side (``cli/src/install.rs``).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path
from typing import Iterator, List

#: The package directory (``.../site-packages/chidori``).
PACKAGE_DIR = Path(__file__).resolve().parent

#: The binary's file name.
BINARY = "chidori"


def lib_dir() -> Path:
    """The directory holding ``libchidori.so`` and the shim libraries of this package."""
    return PACKAGE_DIR / "lib"


def profiles_dir() -> Path:
    """The directory holding the recorded device profiles (``nvidia-h200.json``)."""
    return PACKAGE_DIR / "profiles"


def _candidates() -> Iterator[Path]:
    """Directories where pip may have put the binary, this package's own first (so that a
    package imported from ``--target DIR`` runs DIR's binary, not another install's)."""
    # `pip install --target DIR`: DIR/chidori is this package, DIR/bin the scripts.
    yield PACKAGE_DIR.parent / "bin"
    # A venv, `--user`, `--prefix P` or system install: P/lib/python3.X/site-packages/chidori
    # (lib64, dist-packages elsewhere) beside P/bin.
    yield PACKAGE_DIR.parent.parent.parent.parent / "bin"
    # The scheme this interpreter installs into, then the user scheme.
    yield Path(sysconfig.get_path("scripts"))
    if sys.version_info >= (3, 10):
        user_scheme = sysconfig.get_preferred_scheme("user")
    else:
        user_scheme = "posix_user"
    try:
        yield Path(sysconfig.get_path("scripts", scheme=user_scheme))
    except KeyError:
        pass


def find_binary() -> Path:
    """The path of the installed ``chidori`` binary.

    Raises:
        FileNotFoundError: when no installed binary is found; the message lists where it
            looked.
    """
    searched: List[str] = []
    for directory in _candidates():
        path = directory / BINARY
        searched.append(str(directory))
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(
        "the chidori binary was not found (searched: "
        + ", ".join(searched)
        + "); reinstall the package with `pip install chidori`"
    )
