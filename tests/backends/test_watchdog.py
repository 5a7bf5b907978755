"""A local Ray that raysoft starts is gone when its driver is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from raysoft.backends import watchdog

DRIVER = r"""
import sys, time
from raysoft.backends.session import _WATCHDOG, connect
from raysoft.config import RayConfig
import ray
connect(RayConfig(num_cpus=1))
ray.get(ray.remote(lambda: 1).remote())  # a worker process too
node = ray._private.worker._global_node
pids = [i.process.pid for infos in node.all_processes.values() for i in infos]
print(" ".join(map(str, pids)), _WATCHDOG[0].pid, flush=True)
time.sleep(600)
"""


def test_the_tree_of_a_process_by_hand():
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)",
        ]
    )
    try:
        for _ in range(100):
            if len(watchdog.tree([child.pid])) == 2:
                break
            time.sleep(0.05)
        found = watchdog.tree([child.pid])
        assert found[0] == child.pid and len(found) == 2
        watchdog.end(found, grace=2.0)
        assert not any(watchdog.alive(p) for p in found)
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_a_sigkilled_driver_leaves_no_ray_process():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        *ray_pids, guard = map(int, proc.stdout.readline().split())
        everything = watchdog.tree(ray_pids)
        assert len(everything) > len(ray_pids)  # agents and the worker below the raylet
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(watchdog.alive(p) for p in everything + [guard]):
            time.sleep(0.2)
        assert [p for p in everything + [guard] if watchdog.alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
