"""The cores a process may use: a container's CPU quota (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``) caps
numba's threads, which otherwise start one per core of the host."""

import os

import pytest

from fedgrove._cores import available_cores, cgroup_cpu_limit, fit_numba_to_cpu_quota, numba_threads_for


def _files(root, files: dict):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize("proc, files, cores", [
    # cgroup v2, in a container (its own group is the root)
    ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),
    ("0::/\n", {"cpu.max": "150000 100000\n"}, 1.5),
    # v2 on a host: the process's group and every group above it; the smallest quota holds
    ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/cpu.max": "max 100000", "kubepods/pod1/cpu.max": "400000 100000",
                                "kubepods/cpu.max": "800000 100000"}, 4.0),
    # cgroup v1 (cpu and cpuacct mounted together), with and without a quota
    ("4:cpu,cpuacct:/\n1:name=systemd:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "300000",
                                             "cpu,cpuacct/cpu.cfs_period_us": "100000"}, 3.0),
    ("4:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.cfs_quota_us": "-1", "cpu,cpuacct/cpu.cfs_period_us": "100000"}, None),
    # v1 as seen in a container whose /proc names the host's group but whose mount is its own group
    ("3:cpu:/docker/abc\n", {"cpu/cpu.cfs_quota_us": "50000", "cpu/cpu.cfs_period_us": "100000"}, 0.5),
    # nothing to read
    ("0::/\n", {}, None),
    ("", {}, None),
    ("0::/\n", {"cpu.max": "garbage\n"}, None),
])
def test_the_cpu_quota_of_the_process_group(tmp_path, proc, files, cores):
    _files(tmp_path / "cg", files)
    (tmp_path / "proc_cgroup").write_text(proc)
    assert cgroup_cpu_limit(str(tmp_path / "cg"), str(tmp_path / "proc_cgroup")) == cores


@pytest.mark.parametrize("environ, limit, affinity, threads", [
    ({}, 2.0, 64, 2),                           # a container of two cores on a 64-core host: two threads
    ({}, 1.5, 64, 2),                           # rounded up
    ({}, 0.5, 64, 1),
    ({}, None, 64, None),                       # no quota: numba's own count
    ({}, 8.0, 4, None),                         # the quota leaves every core of the affinity
    ({"NUMBA_NUM_THREADS": "16"}, 2.0, 64, None),  # the user's setting holds
])
def test_numba_threads_follow_the_quota_unless_set(environ, limit, affinity, threads):
    assert numba_threads_for(environ, limit, affinity) == threads


def test_fitting_sets_the_environment_only_where_a_quota_asks(monkeypatch):
    import sys

    import fedgrove._cores as cores

    environ = {}
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda *a: 2.0)
    monkeypatch.setattr(cores, "affinity_cores", lambda: 64)
    monkeypatch.setitem(sys.modules, "numba", sys.modules.get("numba", object()))
    # numba imported already: set now, the variable would make its next compilation raise
    assert fit_numba_to_cpu_quota(environ) is None and environ == {}
    monkeypatch.delitem(sys.modules, "numba")
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda *a: 2.0)
    monkeypatch.setattr(cores, "affinity_cores", lambda: 64)
    assert fit_numba_to_cpu_quota(environ) == 2 and environ == {"NUMBA_NUM_THREADS": "2"}
    assert available_cores() == 2
    monkeypatch.setattr(cores, "cgroup_cpu_limit", lambda *a: None)
    environ = {}
    assert fit_numba_to_cpu_quota(environ) is None and environ == {}
    assert available_cores() == 64


def test_this_machine_is_read_without_error():
    limit = cgroup_cpu_limit()
    assert limit is None or limit > 0
    assert 1 <= available_cores() <= (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                      else os.cpu_count())


def test_import_fedgrove_caps_numbas_threads_before_numba_starts_them():
    # a fresh process whose control group reads as a quota of one core (the files faked through open): importing
    # fedgrove sets NUMBA_NUM_THREADS, and numba, imported after, launches one thread; with no quota, numba's own
    import subprocess
    import sys

    script = """
import builtins, io, os, sys
real = builtins.open
fake = {"/proc/self/cgroup": "0::/\\n", "/sys/fs/cgroup/cpu.max": sys.argv[1] + "\\n"}
builtins.open = lambda path, *a, **k: io.StringIO(fake[path]) if path in fake else real(path, *a, **k)
import fedgrove
builtins.open = real
import numba
print(os.environ.get("NUMBA_NUM_THREADS"), numba.config.NUMBA_NUM_THREADS, numba.get_num_threads())
"""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores < 2:
        pytest.skip("one core: a quota of one leaves numba's count as it is")
    capped = subprocess.run([sys.executable, "-c", script, "100000 100000"], capture_output=True, text=True,
                            env=env, timeout=120)
    assert capped.returncode == 0, capped.stderr[-2000:]
    assert capped.stdout.split() == ["1", "1", "1"]
    free = subprocess.run([sys.executable, "-c", script, "max 100000"], capture_output=True, text=True, env=env,
                          timeout=120)
    assert free.stdout.split() == ["None", str(cores), str(cores)], free.stderr[-2000:]
