"""Usage errors that help: argparse, with the usage of the command that was meant (not of
`unwind` as a whole), a "did you mean" for a misspelled command, and, when a machine format
was asked for, the error as the one JSON document on stdout too (see output.py)."""

from __future__ import annotations

import argparse
import difflib
import sys
from typing import NoReturn

from .output import MACHINE, emit, error_document, wanted_format

ARGV: list[str] = []  # the command line main() parses (it may not be sys.argv)


class Parser(argparse.ArgumentParser):
    """The parser of `unwind` and, through argparse's parser_class, of every subcommand."""

    def error(self, message: str) -> NoReturn:
        if "invalid choice" in message:
            word = message.split("'")[1] if message.count("'") >= 2 else ""
            choices = [c for a in self._actions if isinstance(a, argparse._SubParsersAction)
                       for c in a.choices]
            close = difflib.get_close_matches(word, choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        fmt = wanted_format(ARGV or sys.argv[1:])
        if fmt in MACHINE:
            emit(error_document("usage", message, command=self.prog,
                                usage=self.format_usage().strip()), fmt)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command given, however deep (`unwind manifests publish`)."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return parser
        parser = sub.choices[name]
