"""The Kubernetes API calls the reconciler makes, over plain JSON HTTP.

A thin edge: each method is one API request (listed with its reason in `rbac.py`), bodies are
camelCase dicts in and out, the same shape the pure functions read. Credentials come from the
official client's loaders (kubeconfig, or the in-cluster service account), the transport is a
thread-safe urllib3 pool with explicit timeouts, and no model classes are built: listing a few
hundred pods stays cheap.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

from rlkube.operator.api import GROUP, PLURAL, VERSION
from rlkube.operator.render import kueue_workload
from rlkube.runtime.contract.pod import LABEL_JOB

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0
LIST_TIMEOUT = 120.0  # a full list of a large cluster's pods (the inventory's first sync)
FIELD_MANAGER = "rlkube-operator"
WORKLOADS = f"/apis/{kueue_workload.API_VERSION}"
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class ApiError(Exception):
    """A non-2xx answer: `status` (HTTP code), `reason` (the Status reason) and the message."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class Conflict(ApiError):
    """409 on an update with a resourceVersion precondition: the object changed; decide again."""


def _decode(data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"message": data[:500].decode(errors="replace")}


def _error(status: int, payload: Any) -> ApiError:
    body = payload if isinstance(payload, dict) else {}
    error = Conflict if status == 409 and body.get("reason") == "Conflict" else ApiError
    return error(status, str(body.get("reason") or ""), str(body.get("message") or ""))


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# The namespaced kinds `KubeAPI.create` and `get` take, by their collection's name.
PATHS = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Event": "events",
    "Deployment": "deployments",
    "NetworkPolicy": "networkpolicies",
}
# The group/version of those kinds that are not core/v1.
GROUP_VERSIONS = {"Deployment": "apps/v1", "NetworkPolicy": "networking.k8s.io/v1"}


def collection(kind: str, namespace: str) -> str:
    """The API path of a namespaced kind's collection."""
    prefix = f"/apis/{GROUP_VERSIONS[kind]}" if kind in GROUP_VERSIONS else "/api/v1"
    return f"{prefix}/namespaces/{quote(namespace)}/{PATHS[kind]}"


class KubeAPI:
    """A minimal JSON client of one API server."""

    def __init__(self, host: str, ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None, token: Any = None, verify: bool = True, pool_size: int = 64) -> None:
        self.host = host.rstrip("/")
        # `token` is a string or a zero-argument callable (a refreshing service-account token).
        self._token = token
        kwargs: dict[str, Any] = {"maxsize": pool_size, "block": False, "retries": False}
        if self.host.startswith("https"):
            kwargs.update(cert_reqs="CERT_REQUIRED" if verify else "CERT_NONE", ca_certs=ca_file,
                          cert_file=cert_file, key_file=key_file)
        self._pool = urllib3.PoolManager(**kwargs)
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None, context: str | None = None,
                         pool_size: int = 64) -> KubeAPI:
        """From a kubeconfig (argument, or $KUBECONFIG, or ~/.kube/config), else in-cluster."""
        import os

        from kubernetes import config as kconfig
        from kubernetes.client import Configuration

        configuration = type.__call__(Configuration)
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path or not os.environ.get("KUBERNETES_SERVICE_HOST"):
            kconfig.load_kube_config(config_file=path, context=context, client_configuration=configuration,
                                     persist_config=False)
        else:
            kconfig.load_incluster_config(client_configuration=configuration)

        def token() -> str | None:
            return configuration.get_api_key_with_prefix("authorization") or configuration.get_api_key_with_prefix("BearerToken")

        return cls(configuration.host, ca_file=configuration.ssl_ca_cert, cert_file=configuration.cert_file,
                   key_file=configuration.key_file, token=token, verify=configuration.verify_ssl, pool_size=pool_size)

    # -- transport ----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                content_type: str = "application/json", timeout: float | None = None,
                accept: str = "application/json") -> Any:
        url = self.host + path + (("?" + urlencode(query)) if query else "")
        headers = self._headers(accept)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self._pool.request(
            method, url, body=data, headers=headers,
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=timeout or READ_TIMEOUT),
        )
        payload = _decode(response.data)
        if response.status >= 300:
            raise _error(response.status, payload)
        return payload

    def _headers(self, accept: str) -> dict[str, str]:
        headers = {"Accept": accept}
        token = self._token() if callable(self._token) else self._token
        if token:
            headers["Authorization"] = token if " " in token else f"Bearer {token}"
        return headers

    def list_at(self, path: str, query: Mapping[str, Any] | None = None,
                accept: str = "application/json") -> tuple[list[dict], str]:
        """A list and the resourceVersion it was taken at (where a watch of it starts)."""
        out = self.request("GET", path, query=query, accept=accept, timeout=LIST_TIMEOUT)
        return out.get("items") or [], str((out.get("metadata") or {}).get("resourceVersion") or "")

    def watch(self, path: str, query: Mapping[str, Any], seconds: int) -> Iterator[dict]:
        """The events of a watch of `path` ({"type", "object"} each) until the API server ends it
        after `seconds`; bookmarks included. A socket silent for `seconds` + 30 s raises (urllib3's
        read timeout), so a watch cut off without a FIN never hangs its reader."""
        params = {**query, "watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)}
        response = self._pool.request(
            "GET", self.host + path + "?" + urlencode(params), headers=self._headers("application/json"),
            preload_content=False, timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=seconds + 30.0))
        try:
            if response.status >= 300:
                raise _error(response.status, _decode(response.read()))
            pending = b""
            for chunk in response.stream(1 << 16):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:  # a stream left half read cannot go back to the pool: close it
            response.close()
            response.release_conn()

    # -- jobs ---------------------------------------------------------------------------------

    @staticmethod
    def _jobs_path(namespace: str | None) -> str:
        if namespace is None:
            return f"/apis/{GROUP}/{VERSION}/{PLURAL}"
        return f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace)}/{PLURAL}"

    def get_job(self, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"{self._jobs_path(namespace)}/{quote(name)}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list_jobs(self, namespace: str | None) -> list[dict]:
        return self.request("GET", self._jobs_path(namespace)).get("items") or []

    def patch_job_status(self, namespace: str, name: str, resource_version: str, status_patch: dict) -> dict:
        """Merge-patch .status, failing with Conflict if the job changed since `resource_version`."""
        body = {"metadata": {"resourceVersion": resource_version}, "status": status_patch}
        return self.request("PATCH", f"{self._jobs_path(namespace)}/{quote(name)}/status", body=body,
                            content_type="application/merge-patch+json",
                            query={"fieldManager": FIELD_MANAGER})

    def delete_job(self, namespace: str, name: str, uid: str) -> None:
        # The uid precondition: never delete a new job that reuses the name. Background: the
        # garbage collector removes the children.
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": uid},
                "propagationPolicy": "Background"}
        try:
            self.request("DELETE", f"{self._jobs_path(namespace)}/{quote(name)}", body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    # -- pods and children --------------------------------------------------------------------

    def list_pods(self, namespace: str, label_selector: str) -> list[dict]:
        return self.request("GET", f"/api/v1/namespaces/{quote(namespace)}/pods",
                            query={"labelSelector": label_selector}).get("items") or []

    def list_bound_pods(self) -> list[dict]:
        """Pods of all namespaces that hold node resources (bound, not finished)."""
        selector = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
        return self.request("GET", "/api/v1/pods", query={"fieldSelector": selector}).get("items") or []

    def list_planned_pods(self) -> list[dict]:
        """Metadata of rlkube pods of all namespaces not bound yet (gated, or being scheduled).

        Metadata only (PartialObjectMetadataList): the planned node and GPU count are annotations,
        and a gang of pods' metadata is a fraction of their full objects.
        """
        selector = "spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
        return self.request("GET", "/api/v1/pods", query={"fieldSelector": selector, "labelSelector": LABEL_JOB},
                            accept=METADATA_LIST).get("items") or []

    def list_nodes(self) -> list[dict]:
        return self.request("GET", "/api/v1/nodes").get("items") or []


    def create(self, obj: Mapping[str, Any]) -> bool:
        """Create a namespaced object of a kind in `PATHS`; False when one of that name exists already."""
        namespace = obj["metadata"]["namespace"]
        path = collection(obj["kind"], namespace)
        try:
            self.request("POST", path, body=obj, query={"fieldManager": FIELD_MANAGER})
        except ApiError as exc:
            if exc.status == 409:
                return False
            raise
        return True

    def get(self, kind: str, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"{collection(kind, namespace)}/{quote(name)}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    # -- Kueue (docs/kueue.md) -----------------------------------------------------------------

    def get_workload(self, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", f"{WORKLOADS}/namespaces/{quote(namespace)}/workloads/{quote(name)}")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create_workload(self, workload: Mapping[str, Any]) -> None:
        """Create a job's Workload; one that exists already is the same (its name is the job's)."""
        namespace = workload["metadata"]["namespace"]
        try:
            self.request("POST", f"{WORKLOADS}/namespaces/{quote(namespace)}/workloads", body=workload,
                         query={"fieldManager": FIELD_MANAGER})
        except ApiError as exc:
            if exc.status == 404:
                raise ApiError(404, "NotFound", f"the job is labelled kueue.x-k8s.io/queue-name but this cluster "
                               f"does not serve {kueue_workload.API_VERSION} Workloads: is Kueue installed?") from exc
            if exc.status != 409:
                raise

    def patch_workload_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Merge patch with the Workload's resourceVersion inside: Conflict when Kueue wrote since."""
        self.request("PATCH", f"{WORKLOADS}/namespaces/{quote(namespace)}/workloads/{quote(name)}/status",
                     body=patch, content_type="application/merge-patch+json", query={"fieldManager": FIELD_MANAGER})

    def priority_class_value(self, name: str) -> int | None:
        try:
            return int(self.request("GET", f"/apis/scheduling.k8s.io/v1/priorityclasses/{quote(name)}")["value"])
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def patch_configmap_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.request("PATCH", f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}",
                     body={"data": dict(data)}, content_type="application/merge-patch+json",
                     query={"fieldManager": FIELD_MANAGER})

    def delete_pod(self, namespace: str, name: str, uid: str | None = None, grace_seconds: int | None = None) -> None:
        """Delete a pod; `grace_seconds=0` force-deletes it (a pod stranded on a lost node, whose
        kubelet will never confirm it gone), as Kubernetes' non-graceful node shutdown does."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_seconds is not None:
            body["gracePeriodSeconds"] = grace_seconds
        try:
            self.request("DELETE", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body=body)
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise

    def remove_gate(self, namespace: str, name: str, position: int, gate: str, attempt: int) -> dict | None:
        """Remove one scheduling gate; a JSON patch `test` makes sure it is still that gate on that
        attempt's pod. Returns the pod as patched; None when the pod changed (gone, another
        attempt, gate already off)."""
        ops = [
            {"op": "test", "path": "/metadata/labels/rlkube.io~1attempt", "value": str(attempt)},
            {"op": "test", "path": f"/spec/schedulingGates/{position}/name", "value": gate},
            {"op": "remove", "path": f"/spec/schedulingGates/{position}"},
        ]
        try:
            patched = self.request("PATCH", f"/api/v1/namespaces/{quote(namespace)}/pods/{quote(name)}", body=ops,
                                   content_type="application/json-patch+json", query={"fieldManager": FIELD_MANAGER})
        except ApiError as exc:
            if exc.status in (404, 409, 422) or (exc.status == 500 and "test" in exc.message):
                return None
            raise
        return patched if isinstance(patched, dict) else {}

    # -- events -------------------------------------------------------------------------------

    def post_event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str,
                   component: str = FIELD_MANAGER) -> None:
        """A core/v1 Event about `involved` (apiVersion, kind, name, namespace, uid)."""
        now = _now()
        namespace = involved["namespace"]
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{involved['name']}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": dict(involved),
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            # The legacy core/v1 shape (no eventTime), which `kubectl describe` shows as is.
            "source": {"component": component},
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
        }
        self.create(event)

    # -- leases (leader election) -------------------------------------------------------------

    def _lease_path(self, namespace: str, name: str | None = None) -> str:
        base = f"/apis/coordination.k8s.io/v1/namespaces/{quote(namespace)}/leases"
        return base if name is None else f"{base}/{quote(name)}"

    def get_lease(self, namespace: str, name: str) -> dict | None:
        try:
            return self.request("GET", self._lease_path(namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, lease: dict) -> dict:
        return self.request("POST", self._lease_path(namespace), body=lease)

    def replace_lease(self, namespace: str, lease: dict) -> dict:
        """PUT with the lease's metadata.resourceVersion: Conflict when someone else wrote it."""
        return self.request("PUT", self._lease_path(namespace, lease["metadata"]["name"]), body=lease)


# -- checkpoint records (cleanup.py, checkpoint_sweep.py) ----------------------------------------------


def list_configmaps(api: KubeAPI, namespace: str | None, label_selector: str) -> list[dict]:
    """ConfigMaps with that label in `namespace` (None: every namespace)."""
    path = "/api/v1/configmaps" if namespace is None else f"/api/v1/namespaces/{quote(namespace)}/configmaps"
    return api.request("GET", path, query={"labelSelector": label_selector}).get("items") or []


def delete_configmap(api: KubeAPI, namespace: str, name: str) -> None:
    """Delete a ConfigMap; one already gone is fine."""
    try:
        api.request("DELETE", f"/api/v1/namespaces/{quote(namespace)}/configmaps/{quote(name)}")
    except ApiError as exc:
        if exc.status != 404:
            raise


def scale_deployment(api: KubeAPI, namespace: str, name: str, replicas: int) -> None:
    """Set a Deployment's replicas (a job's environment, scaled with its spec)."""
    api.request("PATCH", f"{collection('Deployment', namespace)}/{quote(name)}",
                body={"spec": {"replicas": replicas}}, content_type="application/merge-patch+json",
                query={"fieldManager": FIELD_MANAGER})
