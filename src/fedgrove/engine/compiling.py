"""numba's compilation of fedgrove's kernels: where its cache can be written, and a note while it compiles.

numba compiles a kernel the first time it is called and keeps the result in
its cache on disk: ``__pycache__`` beside the sources, else ``NUMBA_CACHE_DIR``
or the user's cache folder (``~/.cache/numba``).  Where it can write none of
them (a read-only install run by a user whose home cannot be written: a
container under an arbitrary uid, a system install with ``HOME=/``), numba
refuses to define a cached function at all, and importing the engine failed
with a traceback.  :func:`ensure_cache_folder` then puts the cache in a folder
of the user's own under the temporary directory and notes where.

Where the cache lacks the kernels (the first run after an install, an upgrade
or an edit of the sources) compiling those of a fit takes tens of seconds, in
which a command would otherwise show nothing, or a progress bar standing at
its first step.  :class:`CompileNote` says so once per process, when numba
starts the first compilation of a function of fedgrove's; a run whose kernels
all come from the cache says nothing.  It listens to numba's ``numba:compile``
event, which numba raises only for a compilation, never for a load from the
cache.

Importing this module does both; every module of fedgrove's that defines
kernels imports it first (through ``fedgrove.engine._intrinsics``).
"""

from __future__ import annotations

import logging
import os
import stat
import tempfile
import threading

from numba.core import caching, config, event

from fedgrove.exceptions import FedgroveError
from fedgrove.log import logger

COMPILE_NOTE = ("compiling fedgrove's kernels (the first run after an install or an upgrade: tens of seconds; "
                "numba keeps them on disk for later runs)")


class CompileNote(event.Listener):
    """Calls ``say(COMPILE_NOTE)`` the first time numba starts compiling a function of a ``fedgrove`` module
    (numba's own helpers, compiled inside fedgrove's kernels, and other packages' functions do not count)."""

    def __init__(self, say=logger.info):
        self.say = say
        self.noted = False
        self._lock = threading.Lock()  # parties' threads in one process may compile at once

    def on_start(self, ev) -> None:
        module = getattr(ev.data["dispatcher"].py_func, "__module__", None) or ""
        if module.split(".")[0] != "fedgrove":
            return
        with self._lock:
            if self.noted:
                return
            self.noted = True
        self.say(COMPILE_NOTE)

    def on_end(self, ev) -> None:
        pass


def _probe():
    """A function of this file: numba looks for a cache folder for it as for every kernel beside it."""


def cache_writable(py_func=_probe) -> bool:
    """Whether numba finds a folder it can write for ``py_func``'s cache (beside its source, in
    ``NUMBA_CACHE_DIR`` or in the user's cache folder)."""
    try:
        caching.FunctionCache(py_func)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return False
    return True


def private_folder(path: str) -> bool:
    """Make ``path`` a folder only this user can write, or check that it is one already (another user's folder
    of that name, or one that others may write, could hold compiled code planted there): whether it is."""
    if not hasattr(os, "getuid"):  # no owners to check (Windows): never reused
        return False
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    st = os.lstat(path)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ensure_cache_folder(py_func=_probe, temp: str | None = None) -> str | None:
    """Where numba can write no cache for ``py_func``, point its cache at ``fedgrove-numba-cache-<uid>`` under
    the temporary directory (``temp``, else the system's), kept from run to run, or at a fresh folder there
    when that one is not this user's alone; returns the folder chosen (None where numba had one) and notes it.
    Raises FedgroveError, naming ``NUMBA_CACHE_DIR``, when the temporary directory cannot be written either."""
    if cache_writable(py_func):
        return None
    try:
        temp = temp or tempfile.gettempdir()  # the first of TMPDIR, /tmp, ... that can be written
        folder = os.path.join(temp, f"fedgrove-numba-cache-{getattr(os, 'getuid', lambda: 'user')()}")
        new = not os.path.isdir(folder)
        if not private_folder(folder):
            folder, new = tempfile.mkdtemp(prefix="fedgrove-numba-cache-", dir=temp), True  # this run's alone
    except OSError as exc:
        raise FedgroveError(f"numba can write its cache of compiled kernels neither beside fedgrove's sources "
                            f"nor in the user's cache folder, nor in a temporary directory ({exc}); "
                            f"set NUMBA_CACHE_DIR to a folder this user can write") from None
    os.environ["NUMBA_CACHE_DIR"] = config.CACHE_DIR = folder  # the environment too: numba rereads it
    # said where the folder is made; a later run that finds it says so only at --log-level debug
    logger.log(logging.INFO if new else logging.DEBUG, "numba cannot write its cache beside fedgrove's sources "
               "or in the user's cache folder: fedgrove's compiled kernels are kept in %s (NUMBA_CACHE_DIR "
               "chooses another folder)", folder)
    return folder


ensure_cache_folder()
event.register("numba:compile", CompileNote())
