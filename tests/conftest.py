"""Shared pytest setup: the real-cluster fixtures of tests/cluster (see docs/cluster.md)."""

from tests.cluster.fixtures import cluster, control_plane, kueue  # noqa: F401  (fixtures, registered by import)
