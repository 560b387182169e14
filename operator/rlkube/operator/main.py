"""The operator process: `rlkube operator [flags]` (also `python -m rlkube.operator`).

Start-up order: serve /healthz, /readyz and /metrics; win the leader lease (standby replicas
wait here, healthy but not ready); then run kopf with the handlers of `handlers.py`, the work
queue and the resync loop. Watch streams are bounded on both sides (`server_timeout` asks the
API server to end each watch, `client_timeout` abandons a silent one), because a watch behind a
load balancer can otherwise hang forever with no error: kopf's known "operator stops seeing
events" freeze. Losing the lease exits the process (it never keeps acting without it).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import socket
import sys
import uuid

from rlkube.operator.controller.cluster_state import WatchedInventory
from rlkube.operator.controller.kubeapi import KubeAPI
from rlkube.operator.controller.leader import LeaderElector
from rlkube.operator.controller.metrics import Metrics, serve
from rlkube.operator.controller.reconcile import Reconciler
from rlkube.operator.lifecycle import Settings

logger = logging.getLogger("rlkube.operator")

INVENTORY_SYNC_SECONDS = 120


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="rlkube operator", description="Reconcile RLTrainingJobs into gang-scheduled GPU pods.")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[],
                       help="namespace to watch (repeatable); default: $WATCH_NAMESPACE, else all namespaces")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    p.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--identity", default=None,
                   help="leader-election identity (default: $POD_NAME, else hostname plus a random suffix)")
    p.add_argument("--lease-namespace", default=None,
                   help="namespace of the leader Lease (default: $POD_NAMESPACE, else the first watched namespace)")
    p.add_argument("--lease-name", default="rlkube-operator")
    p.add_argument("--no-leader-election", action="store_true", help="run without the Lease (one replica only)")
    p.add_argument("--metrics-port", type=int, default=int(os.environ.get("RLKUBE_METRICS_PORT", "8080")),
                   help="port of /metrics, /healthz, /readyz (0: off)")
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument("--resync-seconds", type=float, default=10.0,
                   help="every job is reconciled (and rank 0's /progress polled) this often")
    p.add_argument("--workers", type=int, default=16, help="reconciles running at once (different jobs)")
    p.add_argument("--checkpoint-sweep-seconds", type=float, default=300.0,
                   help="at start and this often, clean the hostPath checkpoints of jobs deleted while no "
                        "operator ran (checkpoint_sweep.py)")
    p.add_argument("--backoff-base-seconds", type=float, default=Settings.backoff_base_seconds,
                   help="wait before the first gang restart; doubles per restart")
    p.add_argument("--backoff-max-seconds", type=float, default=Settings.backoff_max_seconds)
    p.add_argument("--unschedulable-retry-seconds", type=float, default=Settings.unschedulable_retry_seconds)
    p.add_argument("--node-lost-grace-seconds", type=float, default=Settings.node_lost_grace_seconds,
                   help="a node not Ready this long is lost: its pods are force-deleted, the gang re-planned")
    p.add_argument("--node-lost-counts", action="store_true",
                   help="a gang restart after a node loss counts against the job's backoffLimit")
    p.add_argument("--host-path-shared", action="store_true",
                   help="the hostPath checkpoint root (/var/lib/rlkube) is one shared filesystem on every node; "
                        "without it a job with no checkpoint.volumeClaim is placed on one node only")
    cache = p.add_mutually_exclusive_group()
    cache.add_argument("--compile-cache-claim", default="", metavar="CLAIM",
                       help="mount this PersistentVolumeClaim (in each job's namespace) into every trainer pod for "
                            "torch.compile's caches, used where a job names no checkpoint.compileCacheDir")
    cache.add_argument("--compile-cache-host-path", default="", metavar="DIR",
                       help="the same with a hostPath directory on every node (created if missing)")
    p.add_argument("--compile-cache-path", default=Settings.compile_cache_path, metavar="PATH",
                   help="where the compile cache volume is mounted in the trainer pods")
    p.add_argument("--status-coalesce-seconds", type=float, default=2.0,
                   help="a status change that only updates pod counts is written at most this often per job "
                        "(0: at once); phase, conditions and placement are always written at once")
    p.add_argument("--watch-server-timeout", type=int, default=300,
                   help="seconds after which the API server ends each watch (kopf reconnects)")
    p.add_argument("--watch-client-timeout", type=int, default=330,
                   help="seconds after which a silent watch is abandoned client-side")
    p.add_argument("--inventory", choices=("watch", "list"), default="watch",
                   help="how plans see the GPU inventory: watches of nodes, pods and jobs kept in memory "
                        "(default), or listings every 2 s (cluster_state.py)")
    p.add_argument("--liveness", default=None,
                   help="also serve kopf's own liveness endpoint at this URL (e.g. http://0.0.0.0:8081/healthz)")
    p.add_argument("--log-level", default=os.environ.get("RLKUBE_LOG_LEVEL", "INFO"))
    args = p.parse_args(argv)
    if not args.namespace and not args.all_namespaces and os.environ.get("WATCH_NAMESPACE"):
        args.namespace = [ns for ns in os.environ["WATCH_NAMESPACE"].split(",") if ns]
    return args


def settings_from(args: argparse.Namespace) -> Settings:
    """The lifecycle's settings from the flags of the same names (each has one)."""
    return Settings(**{field.name: getattr(args, field.name) for field in dataclasses.fields(Settings)})


def pod_owner() -> dict | None:
    """An ownerReference to this operator's Pod (the chart passes POD_NAME and POD_UID), else None."""
    name, uid = os.environ.get("POD_NAME"), os.environ.get("POD_UID")
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid} if name and uid else None


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}"


def run(argv: list[str] | None = None) -> int:
    """Run the operator until SIGTERM/SIGINT (or until the leader lease is lost: exit 1)."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Our DEBUG is one line per reconcile; kopf's and urllib3's would be one per API request.
    logging.getLogger("kopf").setLevel(max(logging.INFO, logging.getLevelName(args.log_level.upper())))
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)  # "Handler ... succeeded" per event
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    logging.getLogger("aiohttp").setLevel(logging.WARNING)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's login reads it too
    api = KubeAPI.from_environment(args.kubeconfig)
    metrics = Metrics()
    if args.metrics_port:
        serve(metrics, args.metrics_port, args.metrics_host)

    elector = None
    if not args.no_leader_election:
        lease_ns = args.lease_namespace or os.environ.get("POD_NAMESPACE") or (args.namespace or ["default"])[0]
        elector = LeaderElector(api, lease_ns, args.identity or default_identity(), name=args.lease_name,
                                owner=pod_owner())
        elector.acquire()

        def lost() -> None:
            # Never keep acting without the lease: stop now, the Deployment restarts us as a standby.
            logger.critical("leader lease lost: exiting")
            os._exit(1)

        elector.keep_renewing(lost)
    metrics.leader.set(1)

    settings = settings_from(args)
    inventory = None
    if args.inventory == "watch":
        inventory = WatchedInventory(api, args.namespace, seconds=args.watch_server_timeout).start()
        if not inventory.wait_synced(INVENTORY_SYNC_SECONDS):
            logger.warning("inventory: watches not listed within %ds; plans fail and retry until they are", INVENTORY_SYNC_SECONDS)
    reconciler = Reconciler(api, settings, metrics, inventory=inventory, background_events=True)
    try:
        asyncio.run(_operate(args, api, reconciler, metrics))
    finally:
        if inventory is not None:
            inventory.stop()
        if elector is not None:
            elector.release()
    return 0


async def _operate(args: argparse.Namespace, api: KubeAPI, reconciler: Reconciler, metrics: Metrics) -> None:
    import kopf

    from rlkube.operator.controller.checkpoint_sweep import sweep_loop
    from rlkube.operator.controller.handlers import (
        WorkQueue,
        build_registry,
        follow_inventory_jobs,
        follow_inventory_pods,
        resync_loop,
    )

    queue = WorkQueue(reconciler, workers=args.workers, metrics=metrics)
    inventory = reconciler.inventory
    watched = isinstance(inventory, WatchedInventory)
    if watched:  # the inventory watches every pod and job already: its events wake the jobs
        follow_inventory_pods(queue, inventory.pods, args.namespace)
        follow_inventory_jobs(queue, inventory.jobs_by_ns)
    registry = build_registry(queue, pod_events=not watched, job_events=not watched)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = args.watch_server_timeout
    settings.watching.client_timeout = args.watch_client_timeout
    settings.watching.connect_timeout = 10
    settings.peering.standalone = True      # leadership is the Lease's job (leader.py)
    settings.posting.enabled = False        # Events are posted by the reconciler (handlers.py says why)
    namespaces = list(args.namespace)

    def list_jobs():
        if watched:  # the job watches hold every job: no listing
            yield from inventory.job_keys()
            return
        if namespaces:
            for ns in namespaces:
                for job in api.list_jobs(ns):
                    yield (ns, job["metadata"]["name"])
        else:
            for job in api.list_jobs(None):
                yield (job["metadata"]["namespace"], job["metadata"]["name"])

    ready = asyncio.Event()

    async def mark_ready() -> None:
        await ready.wait()
        metrics.ready = True
        logger.info("operator ready: watching %s", ", ".join(namespaces) or "all namespaces")

    helpers = [
        asyncio.create_task(resync_loop(queue, list_jobs, args.resync_seconds, metrics)),
        asyncio.create_task(mark_ready()),
        asyncio.create_task(sweep_loop(reconciler, namespaces, args.checkpoint_sweep_seconds, metrics, queue.executor)),
    ]
    try:
        await kopf.operator(
            registry=registry,
            settings=settings,
            namespaces=namespaces,
            clusterwide=not namespaces,
            standalone=True,
            liveness_endpoint=args.liveness,
            ready_flag=ready,
        )
    finally:
        for task in helpers:
            task.cancel()
        queue.close()
