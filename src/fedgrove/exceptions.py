"""One exception family for the whole package.

Every error fedgrove raises on purpose derives from :class:`FedgroveError`, so a
caller (and the CLI) can tell a user mistake from a bug.  Each subclass carries
the CLI exit code it maps to; the codes are documented in ``docs/cli.md``.
"""

from __future__ import annotations

from typing import Callable, Iterable


def listing(items: Iterable, limit: int = 10, show: Callable = str) -> str:
    """The first ``limit`` items for a message, comma-separated, then " ..." when there are more."""
    items = list(items)
    return ", ".join(show(v) for v in items[:limit]) + (" ..." if len(items) > limit else "")


class FedgroveError(Exception):
    """Base class of all errors raised on purpose by fedgrove."""

    exit_code = 1


class InvalidParameterError(FedgroveError, ValueError):
    """A parameter has a value outside what is accepted."""

    exit_code = 2


class DataError(FedgroveError, ValueError):
    """Input data cannot be read or does not have the expected content."""

    exit_code = 3


class ModelFormatError(FedgroveError, ValueError):
    """A model file is corrupt, of another kind, or of an unsupported version."""

    exit_code = 4


class NotFittedError(FedgroveError, AttributeError):
    """A model was used before it was trained."""

    exit_code = 2


class ProtocolError(FedgroveError):
    """A federated protocol received something it must not accept."""

    exit_code = 5


class PeerTimeoutError(ProtocolError):
    """A peer did not answer within the configured timeout."""

    exit_code = 6


class PrivacyBudgetError(FedgroveError):
    """A differential-privacy mechanism would exceed the configured budget."""

    exit_code = 7


class LedgerError(FedgroveError):
    """A ledger file fails verification (a broken hash chain, a bad signature, a contribution that does not
    recompute)."""

    exit_code = 8


class Terminated(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM: ``kill``, ``docker stop``, a service manager).  It ends as Ctrl-C
    ends it: a party tells its peers, checkpoints stay as the last finished tree left them, and the command exits
    143 (128 + the signal's number)."""
