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

numba keys a kernel's cache by the source of the file that defines it, and
nothing else: a kernel that calls a kernel or an intrinsic of another file
(``engine.sparse`` calls ``engine.histogram.add_row_range``; several kernels
``engine._intrinsics.prefetch``) would load its old compiled code after an
upgrade or an edit that changed only the other file.  :func:`track_callees`
puts, before numba's own cache locators, locators for fedgrove's files whose
stamp is numba's stamp of the kernel's file together with the contents of every
fedgrove file whose kernels or intrinsics the kernel's module imports, directly
or through those files (:func:`callee_files`).

Importing this module does all three; every module of fedgrove's that defines
kernels imports it first (through ``fedgrove.engine._intrinsics``).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import stat
import sys
import tempfile
import threading
import types

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


#: folders whose kernels' caches :func:`track_callees` stamps with their callees' files (tests add one)
TRACKED = [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]


def _tracked(path) -> bool:
    path = os.path.abspath(path)
    return any(path.startswith(root + os.sep) for root in TRACKED)


@functools.lru_cache(maxsize=None)
def _digest(path: str, mtime: float, size: int) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _file_digest(path: str) -> str:
    st = os.stat(path)
    return _digest(path, st.st_mtime, st.st_size)  # (read again when the file changed in this process)


def _kernel_function(value):
    """The Python function behind a numba kernel or intrinsic, else None."""
    if isinstance(value, types.FunctionType):
        return None
    for attr in ("py_func", "_defn"):  # a dispatcher's function; an intrinsic's code generator
        try:
            fn = getattr(value, attr, None)
        except Exception:  # (an object whose attributes compute something, and fail)
            continue
        if isinstance(fn, types.FunctionType):
            return fn
    return None


def callee_files(py_func) -> list[str]:
    """The files, other than ``py_func``'s own, of the tracked kernels and intrinsics that ``py_func``'s module
    holds (imported: every kernel of the module may call them, and one defined further down the file does not
    exist yet when numba sets up ``py_func``'s cache) or its closure holds, and of those that their modules
    hold in turn, sorted.  A tracked module the module holds counts with its kernels."""
    own = os.path.abspath(py_func.__code__.co_filename)
    seen, files, todo = set(), set(), [py_func]
    while todo:
        fn = todo.pop()
        key = (fn.__code__.co_filename, id(fn.__globals__))
        if key in seen:
            continue
        seen.add(key)
        values = list(fn.__globals__.values()) + _cells(fn)
        for value in list(values):
            if isinstance(value, types.ModuleType) and _tracked(getattr(value, "__file__", None) or ""):
                values += list(vars(value).values())
        for value in values:
            callee = _kernel_function(value)
            if callee is None or not _tracked(callee.__code__.co_filename):
                continue
            path = os.path.abspath(callee.__code__.co_filename)
            if path != own:
                files.add(path)
            if (callee.__code__.co_filename, id(callee.__globals__)) not in seen:
                todo.append(callee)
    return sorted(files)


def _cells(fn) -> list:
    """What the filled cells of ``fn``'s closure hold."""
    held = []
    for cell in fn.__closure__ or ():
        try:
            held.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    return held


def track_callees() -> None:
    """Put, before each of numba's cache locators backed by a source file, one that serves the tracked files'
    functions alone and stamps their caches also with the contents of their :func:`callee_files` (numba's
    own locators go on serving every other function as before)."""
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # (numba's names: >= 0.61, 0.60)
    if any(getattr(cls, "_fedgrove", False) for cls in impl._locator_classes):
        return

    def from_function(cls, py_func, py_file):
        if not _tracked(py_file):
            return None
        self = super(cls, cls).from_function(py_func, py_file)
        if self is not None:
            self._callees = callee_files(py_func)
        return self

    def get_source_stamp(self):
        own = super(type(self), self).get_source_stamp()
        if getattr(sys, "frozen", False) or not self._callees:  # (a kernel calling none: numba's own stamp)
            return own
        try:
            return own, tuple((os.path.basename(f), _file_digest(f)) for f in self._callees)
        except OSError:  # a file that cannot be read as one (inside a zip archive): numba's own stamp
            return own

    ours = [type(f"Fedgrove{cls.__name__.lstrip('_')}", (cls,),
                 {"_fedgrove": True, "from_function": classmethod(from_function),
                  "get_source_stamp": get_source_stamp})
            for cls in impl._locator_classes if issubclass(cls, caching._SourceFileBackedLocatorMixin)]
    impl._locator_classes[:0] = ours


track_callees()
ensure_cache_folder()
event.register("numba:compile", CompileNote())
