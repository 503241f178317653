"""The cores this process may use: its CPU affinity, and the CPU quota of its control group.

In a container with a CPU limit (``docker run --cpus 2``, a Kubernetes pod's
``limits.cpu``) the machine's cores all stay in the process's affinity, so
numba, like OpenMP, starts a thread per core of the host: 64 spinning threads
on a quota of two cores are throttled to a crawl.  Imported first by
``import fedgrove``, :func:`fit_numba_to_cpu_quota` sets ``NUMBA_NUM_THREADS``
to the quota (rounded up) before numba starts its threads, unless it is set
already; ``available_cores`` is what the runner shares among the parties of
one machine.  Read from cgroup v2's ``cpu.max`` or v1's
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, at the process's own group and
every group above it (the smallest quota holds).
"""

from __future__ import annotations

import math
import os
import sys

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _groups_up(path: str):
    """``path`` and every group above it, up to the root."""
    parts = [p for p in path.split("/") if p]
    for k in range(len(parts), -1, -1):
        yield "/" + "/".join(parts[:k])


def cgroup_cpu_limit(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> float | None:
    """The CPU quota of this process's control group in cores (1.5: one and a half), None where there is none
    or it cannot be read."""
    limits = []
    for line in (_read(proc_cgroup) or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            for group in _groups_up(path):
                fields = (_read(os.path.join(root, group.lstrip("/"), "cpu.max")) or "").split()
                if len(fields) == 2 and fields[0] != "max":
                    limits.append((fields[0], fields[1]))
        elif "cpu" in controllers.split(","):  # cgroup v1: cpu, or cpu,cpuacct
            for mount in (controllers, "cpu", "cpu,cpuacct"):
                for group in _groups_up(path):
                    where = os.path.join(root, mount, group.lstrip("/"))
                    limits.append((_read(os.path.join(where, "cpu.cfs_quota_us")),
                                   _read(os.path.join(where, "cpu.cfs_period_us"))))
    cores = []
    for quota, period in limits:
        try:
            q, p = int(quota), int(period)
        except (TypeError, ValueError):
            continue
        if q > 0 and p > 0:
            cores.append(q / p)
    return min(cores) if cores else None


def affinity_cores() -> int:
    """The cores this process may run on (its affinity), as numba counts them."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def available_cores(limit: float | None = None) -> int:
    """The cores this process may use: its affinity, at most its control group's CPU quota rounded up."""
    limit = cgroup_cpu_limit() if limit is None else limit
    cores = affinity_cores()
    return cores if limit is None else max(1, min(cores, math.ceil(limit - 1e-9)))


def numba_threads_for(environ, limit: float | None, affinity: int) -> int | None:
    """The ``NUMBA_NUM_THREADS`` to set for a CPU quota of ``limit`` cores with ``affinity`` cores in the
    process's affinity; None where the user set it, there is no quota, or the quota leaves every core."""
    if environ.get("NUMBA_NUM_THREADS") or limit is None:
        return None
    n = max(1, math.ceil(limit - 1e-9))
    return n if n < affinity else None


def fit_numba_to_cpu_quota(environ=os.environ) -> int | None:
    """Set ``NUMBA_NUM_THREADS`` in ``environ`` to the CPU quota where :func:`numba_threads_for` says so; returns
    what it set.  Only before numba is imported: it sizes its pool from the variable then, and a value changed
    after its threads started makes its next compilation raise."""
    if "numba" in sys.modules:
        return None
    n = numba_threads_for(environ, cgroup_cpu_limit(), affinity_cores())
    if n is not None:
        environ["NUMBA_NUM_THREADS"] = str(n)
    return n
