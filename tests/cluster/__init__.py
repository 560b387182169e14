"""The test cluster harness: real Kubernetes components built from their Go modules.

`python -m tests.cluster.cluster up|down|status` (or `make cluster-up`) drives it; the pytest
fixtures in `tests.cluster.fixtures` use it. See docs/cluster.md.
"""
