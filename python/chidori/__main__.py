"""``python -m chidori ARGS``: runs the installed ``chidori`` binary with ``ARGS``."""

from __future__ import annotations

import os
import sys

from chidori._find import find_binary


def main() -> None:
    """Replace this process with the ``chidori`` binary, passing the same arguments."""
    try:
        binary = find_binary()
    except FileNotFoundError as error:
        print(f"chidori: {error}", file=sys.stderr)
        sys.exit(2)
    os.execv(binary, [str(binary), *sys.argv[1:]])


if __name__ == "__main__":
    main()
