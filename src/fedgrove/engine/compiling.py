"""A note in fedgrove's log when numba starts compiling one of fedgrove's kernels.

numba compiles a kernel the first time it is called and keeps the result in
its cache on disk (``__pycache__`` beside the sources, or ``NUMBA_CACHE_DIR``).
Where the cache lacks them (the first run after an install, an upgrade or an
edit of the sources) compiling the kernels of a fit takes tens of seconds, in
which a command would otherwise show nothing, or a progress bar standing at
its first step.  :class:`CompileNote` says so once per process, when numba
starts the first compilation of a function of fedgrove's; a run whose kernels
all come from the cache says nothing.  It listens to numba's ``numba:compile``
event, which numba raises only for a compilation, never for a load from the
cache.  Importing this module registers it (the kernels' own modules import
it through ``fedgrove.engine._intrinsics``).
"""

from __future__ import annotations

import threading

from numba.core import event

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


event.register("numba:compile", CompileNote())
