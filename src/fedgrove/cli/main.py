"""Entry point: the typer app, its commands, and error-to-exit-code mapping.

Exit codes: 0 success; 1 other fedgrove error; 2 bad parameter or usage;
3 bad input data; 4 bad model file; 5 protocol error; 6 peer timeout;
7 privacy budget exhausted; 8 ledger verification failed; 130 interrupted (Ctrl-C); 143 stopped by SIGTERM
(``kill``, ``docker stop``: a party tells its peers, as on Ctrl-C).  Errors print one line on
stderr, never a traceback (set FEDGROVE_DEBUG=1 to see one).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import typer

from fedgrove.cli import bag as bag_cmd
from fedgrove.cli import datasets as datasets_cmd
from fedgrove.cli import federation as federation_cmd
from fedgrove.cli import info as info_cmd
from fedgrove.cli import ledger as ledger_cmd
from fedgrove.cli import partition as partition_cmd
from fedgrove.cli import predict as predict_cmd
from fedgrove.cli import reproduce as reproduce_cmd
from fedgrove.cli import train as train_cmd
from fedgrove.cli.common import listed
from fedgrove.exceptions import FedgroveError, Terminated

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="fedgrove: federated gradient-boosted trees and random forests.")
listed(app)(train_cmd.train)
listed(app)(predict_cmd.predict)
listed(app)(partition_cmd.partition)
listed(app)(info_cmd.info)
listed(app)(federation_cmd.simulate)
listed(app)(federation_cmd.party)
listed(app)(federation_cmd.certs)
listed(app)(reproduce_cmd.reproduce)
listed(app)(bag_cmd.bag)
app.add_typer(ledger_cmd.app, name="ledger")
app.add_typer(datasets_cmd.app, name="datasets")


LOG_LEVELS = ("debug", "info", "warning", "error")


def _print_version(value: bool) -> None:
    if value:  # eager: before the group asks for a command
        import fedgrove

        typer.echo(fedgrove.__version__)
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit", is_eager=True,
                                       callback=_print_version, expose_value=False),
          log_level: str = typer.Option("info", "--log-level", help="Which of fedgrove's notes to print on stderr: "
                                        "debug, info (what a run skipped or is waiting for), warning or error")):
    if log_level not in LOG_LEVELS:
        raise typer.BadParameter(f"must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}",
                                 param_hint="'--log-level'")
    _show_log(log_level)


class _ConsoleLog(logging.Handler):
    """fedgrove's log records as one line each on the CLI's stderr console (``note:``, ``warning:``)."""

    def emit(self, record: logging.LogRecord) -> None:
        from rich.markup import escape

        from fedgrove.cli.common import console

        kind = {"INFO": "note", "DEBUG": "debug"}.get(record.levelname, record.levelname.lower())
        style = "yellow" if record.levelno >= logging.WARNING else "dim"
        try:
            console.print(f"[{style}]{kind}:[/{style}] {escape(record.getMessage())}", markup=True)
        except Exception:  # a log line must never end a run
            self.handleError(record)


def _show_log(level: str) -> None:
    """Send the package logger's records at ``level`` and above to the console, once however often main runs."""
    from fedgrove.log import logger

    for h in [h for h in logger.handlers if isinstance(h, _ConsoleLog)]:
        logger.removeHandler(h)
    logger.addHandler(_ConsoleLog())
    logger.setLevel(level.upper())
    if level != "debug":  # gRPC's C core logs its own errors ("E1124 ... add_port.cc:83] Failed to add port"),
        # which fedgrove states in words; --log-level debug (or GRPC_VERBOSITY set by hand) keeps them
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")


def main(argv: list[str] | None = None) -> int:
    from rich.markup import escape

    from fedgrove.cli.common import console

    try:
        code = app(args=argv, standalone_mode=False, prog_name="fedgrove")
        # typer returns the code of an Exit instead of raising it, and turns Ctrl-C into Exit(130): an interrupted
        # run must not exit 0 as if it had finished (commands themselves return None)
        if isinstance(code, int) and not isinstance(code, bool) and code != 0:
            if code == 130 and _signalled.is_set():
                console.print("stopped (SIGTERM)")
                return 128 + signal.SIGTERM
            if code == 130:
                console.print("interrupted")
            return code
        return 0
    except FedgroveError as exc:
        if os.environ.get("FEDGROVE_DEBUG"):
            raise
        console.print(f"[red]error:[/red] {escape(str(exc))}", markup=True)
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        console.print("aborted")
        return 130
    except Exception as exc:  # click usage errors and OS errors
        # usage errors: click's ClickException, or the copy of click that newer typer releases vendor
        if any(c.__name__ == "ClickException" for c in type(exc).__mro__):
            exc.show()
            return exc.exit_code
        if isinstance(exc, OSError):
            if os.environ.get("FEDGROVE_DEBUG"):
                raise
            detail = f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")
            console.print(f"[red]error:[/red] {escape(detail)}", markup=True)
            return 1
        raise


_signalled = threading.Event()  # SIGTERM arrived: the Ctrl-C exit it became is reported as such


def _on_sigterm(signum, frame) -> None:
    _signalled.set()
    raise Terminated()


def run() -> None:
    # SIGTERM ends a command as Ctrl-C does, through the same clean-up: a party tells its peers (which stop at
    # once, where they waited out their timeout) and closes its channel; a checkpoint keeps the last whole tree
    signal.signal(signal.SIGTERM, _on_sigterm)
    # a terminal whose encoding cannot show a feature's or a party's name (an ASCII or Latin-1 locale, Python's
    # UTF-8 mode off) gets it escaped, as Python's stderr does, where printing it ended the command
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    sys.exit(main())


if __name__ == "__main__":
    run()
