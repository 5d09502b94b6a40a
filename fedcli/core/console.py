"""Rich consoles: results to stdout, warnings and errors to stderr (resolved at print time, so
test runners that swap the streams see the output)."""

from rich.console import Console
from rich.markup import escape

out = Console(highlight=False)
err = Console(stderr=True, highlight=False)


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {escape(message)}", soft_wrap=True)


def error(message: str) -> None:
    err.print(f"[bold red]error:[/bold red] {escape(message)}", soft_wrap=True)
