"""``pipeweave`` command line: one argparse sub-command per module ``cli/cmd_<name>.py``.

Each module exposes ``add_parser(subparsers)``, which adds its parser and sets ``func`` (a
function ``(args) -> int``). Library errors (``ValueError``: an unknown schedule, a bad
shape, a deadlocking schedule) are printed as ``pipeweave: error: <message>`` and exit with
status 2, without a traceback; a Ctrl-C at any moment (even while modules are imported) as
``pipeweave: error: interrupted (Ctrl-C)`` with status 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from .. import __version__
from ..collector import exit_without_collection
from ..interrupts import ctrl_c_deferred

__all__ = ["COMMANDS", "INTERRUPTED", "build_parser", "main", "entry", "HelpFormatter"]

INTERRUPTED = 130
"""The exit status of a Ctrl-C (what a shell reports for a process ended by SIGINT)."""
COMMANDS = ["schedules", "show", "simulate", "train", "export", "profile", "plan", "placement",
            "tune", "auto"]
"""Sub-commands, in help order; each is the module ``pipeweave.cli.cmd_<name>``."""


def _command_modules(names: Sequence[str] = COMMANDS) -> list[ModuleType]:
    return [importlib.import_module(f"pipeweave.cli.cmd_{name}") for name in names]


def _asked(argv: Sequence[str]) -> list[str]:
    """The command modules to import for ``argv``: the one it names first, where it does
    (``pipeweave auto ...`` then parses as with every command, without importing the
    others: torch and the runtime for ``train``, 1 CPU-s), else all (``--help``, a typo)."""
    return [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default in its help line.

    Options whose default is ``None``/``False`` (unset flags, or defaults that depend on other
    options, which their help text states) get no ``(default: ...)`` suffix.
    """

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if ("%(default)" in text or action.default in (None, False, argparse.SUPPRESS)
                or not action.option_strings or action.default == []):
            return text
        return text + " (default: %(default)s)"


class _SubcommandParser(argparse.ArgumentParser):
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def build_parser(commands: Sequence[str] = COMMANDS) -> argparse.ArgumentParser:
    """The top-level parser with these sub-commands (default: every one)."""
    parser = argparse.ArgumentParser(
        prog="pipeweave", formatter_class=HelpFormatter,
        description="Pipeline-parallel training: schedules as data, one simulator, one runtime.",
    )
    parser.add_argument("--version", action="version", version=f"pipeweave {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                       parser_class=_SubcommandParser)
    for module in _command_modules(commands):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        return _run(argv)
    except KeyboardInterrupt:  # Ctrl-C where no command handles it (importing, preparing)
        print("pipeweave: error: interrupted (Ctrl-C)", file=sys.stderr)
        return INTERRUPTED


def entry() -> None:
    """The ``pipeweave`` program (``python -m pipeweave``, the console script): :func:`main`,
    then the exit without the collector's last scan (:mod:`pipeweave.collector`)."""
    exit_without_collection(main())


def _run(argv: list[str] | None) -> int:
    with ctrl_c_deferred():  # the command's modules import torch, numpy (seconds)
        parser = build_parser(_asked(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse's own usage errors (status 2) and --help (0)
        return exit_.code if isinstance(exit_.code, int) else 2
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return func(args)
    except ValueError as error:  # user errors from the library: message only, no traceback
        print(f"pipeweave: error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `pipeweave show ... | head`
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
