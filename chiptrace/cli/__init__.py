"""The `chiptrace` command. Each subcommand is one module in this package that defines
NAME, HELP, ORDER, add_arguments(parser) and run(args) -> exit code; they are found by
listing the package, so adding a command means adding one file. Heavy imports (DuckDB,
Textual, the emulator) happen inside run(), so `chiptrace --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import pkgutil
import sys
from collections.abc import Sequence
from types import ModuleType

from chiptrace._version import __version__
from chiptrace.errors import ChiptraceError


def _commands() -> list[ModuleType]:
    mods = []
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods.append(mod)
    return sorted(mods, key=lambda m: (getattr(m, "ORDER", 50), m.NAME))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chiptrace",
        description="Find what holds a multi-chip AI system back: chip-tagged "
        "OpenTelemetry spans, Parquet trace dirs, SQL, bottleneck reports, a live view.",
    )
    parser.add_argument("--version", action="version", version=f"chiptrace {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in _commands():
        p = sub.add_parser(
            mod.NAME, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP)
        )
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


class _OneLine(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        msg = record.getMessage().splitlines()[0] if record.getMessage() else ""
        if msg.startswith("chiptrace: "):
            msg = msg[len("chiptrace: ") :]
        return f"chiptrace: {record.levelname.lower()}: {msg}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, and turn ChiptraceError into one line and an exit code.
    A reader that stops early (`| head -1`) ends the command quietly, whatever it prints."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # what is still buffered fails here, not in the exit's flush
        return code
    except BrokenPipeError:
        _drop_stdout()
        return 0


def _drop_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, and that flush would
    print `Exception ignored ... BrokenPipeError` for the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (a test's capture)
        pass


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine())
    root = logging.getLogger("chiptrace")
    saved = root.level, root.propagate
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    root.propagate = False
    from chiptrace.store import forget_skipped

    forget_skipped()  # each command names each bad part it skips once
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:
        raise  # main's: not a DuckDB error, not worth a line
    except ChiptraceError as e:
        if isinstance(e.__cause__, BrokenPipeError):  # "cannot write -": the reader left
            raise e.__cause__ from None
        print(f"chiptrace: error: {e}", file=sys.stderr)
        return e.exit_code
    except Exception as e:
        # DuckDB failing on a file (a corrupt data page) is bad input, not a bug: one line.
        if not type(e).__module__.lstrip("_").startswith("duckdb"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"chiptrace: error: DuckDB: {first}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        root.propagate = saved[1]


if __name__ == "__main__":
    sys.exit(main())
