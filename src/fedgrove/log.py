"""The package logger.  Library code logs through ``logger``; it never prints."""

import logging
import time

logger = logging.getLogger("fedgrove")
logger.addHandler(logging.NullHandler())


class NoteTimer:
    """When long work should note how far it has come: once ``first`` seconds have passed since it began,
    then every ``every`` seconds, so that short work says nothing."""

    def __init__(self, first: float, every: float):
        self.start = time.monotonic()
        self.every = every
        self._due = self.start + first

    def due(self) -> float | None:
        """The seconds since the start if a note is due now (the next one is then ``every`` s away), else None."""
        now = time.monotonic()
        if now < self._due:
            return None
        self._due = now + self.every
        return now - self.start
