"""`python -m fedcli` and the `fedcli` command. The commands are built from the registries, which take in the
installed plugins (core/plugins.py): a plugin refused there is one line too, not a traceback."""

import sys

from fedcli.core import console
from fedcli.core.errors import UserError


def main() -> None:
    try:
        from fedcli.cli import app
    except UserError as exc:
        console.error(str(exc))
        sys.exit(2)
    app()


if __name__ == "__main__":
    main()
