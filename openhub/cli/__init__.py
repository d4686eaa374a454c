"""The `openhub` command line (click)."""

from openhub.cli.commands import main

__all__ = ["main"]
