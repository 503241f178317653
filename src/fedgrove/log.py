"""The package logger.  Library code logs through ``logger``; it never prints."""

import logging

logger = logging.getLogger("fedgrove")
logger.addHandler(logging.NullHandler())
