"""Shared pytest setup: the real-cluster fixtures of tests/cluster (see docs/cluster.md), and the
runtime's logging state put back after every test."""

import pytest

from rlkube.runtime.infra import log as runtime_log
from tests.cluster.fixtures import cluster, control_plane, kueue  # noqa: F401  (fixtures, registered by import)


@pytest.fixture(autouse=True)
def runtime_log_state():
    """Undo what a test did to the process-wide state of `rlkube.runtime.infra.log`: the handler,
    level and propagation `setup_logging` gives the `rlkube.runtime` logger (a trainer run in a test
    calls it), and the keys `warn_once` has seen. Without this a test's verdict depends on the tests
    before it: one that runs a trainer makes the logger non-propagating, so pytest attaches its
    capture handler to the logger itself and a later test that counts warnings sees each twice; a
    warning already given by an earlier test is never given again."""
    logger = runtime_log.log
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    warned = set(runtime_log._warned)
    yield
    for handler in [h for h in logger.handlers if h not in handlers]:
        logger.removeHandler(handler)
    logger.propagate = propagate
    logger.setLevel(level)
    runtime_log._warned.clear()
    runtime_log._warned.update(warned)
