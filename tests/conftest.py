"""Shared fixtures: one Ray session for the whole test run. The shared helpers (small configs,
dataset writers, digests, fakes) are in the ``support`` package beside this file.

``make test`` runs ``pytest -m "not slow"``, which leaves out the tests marked ``slow`` (over
about 3 s each here: multi-node clusters, end-to-end runs that must converge, subprocesses) and
runs the rest in about four minutes on 2 cores. ``make test-all`` (CI) runs plain ``pytest``:
everything; ``-m slow`` runs only the slow ones.
"""

from __future__ import annotations

import logging
import os

import pytest

# No Ray call starts a Ray by itself (Ray's auto-connect, with its defaults: the workers' logs
# printed here): a test that needs Ray says so (ray_session) or starts one through raysoft. Set
# before anything imports ray, which reads it once.
os.environ["RAY_ENABLE_AUTO_CONNECT"] = "0"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray instance (2 CPUs, token auth on, no dashboard, no workers' logs here) shared
    by every Ray test. A Ray that something else left running is stopped first: its settings
    (a test's own, or Ray's defaults) would otherwise hold for every test after it."""
    import ray

    if ray.is_initialized() and not getattr(ray_session, "ours", False):
        ray.shutdown()
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)  # a Ray of its own, never another one on the machine
        ray_session.ours = True  # type: ignore[attr-defined]
    yield ray
    ray.shutdown()
    ray_session.ours = False  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config, items):
    """``RAYSOFT_TEST_ORDER=reverse`` or ``shuffle:SEED`` runs the tests in another order, to show
    that none depends on the ones before it (docs/running.md#development)."""
    import os
    import random

    order = os.environ.get("RAYSOFT_TEST_ORDER", "")
    if order == "reverse":
        items.reverse()
    elif order.startswith("shuffle:"):
        random.Random(int(order.split(":", 1)[1])).shuffle(items)
    elif order:
        raise pytest.UsageError(f"RAYSOFT_TEST_ORDER: {order!r} is not 'reverse' or 'shuffle:SEED'")
