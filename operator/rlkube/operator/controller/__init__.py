"""The controller: the operator's I/O edge, wired in this order.

`handlers` are kopf's handlers, which only request a reconcile (a per-job work queue and a resync
loop); `reconcile` reads the job and its pods, calls the pure `lifecycle.decide` and writes what it
decided (status first, then deletes, creates, ungates); `kubeapi` is one method per API request.
Beside them: `cluster_state` keeps the GPU inventory (planning/inventory.py) fed by watches
(`watch`), `leader` holds the Lease, `metrics` serves Prometheus and the health endpoints,
`progress_client` polls rank 0's /progress, `checkpoint_sweep` cleans after jobs deleted while no
operator ran, and `rbac` names every API verb the operator uses (the chart's RBAC is generated
from it). Nothing below this package imports it.
"""
