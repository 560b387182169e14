"""The user's side of the API server: the few requests `rlkube submit` and `rlkube logs` make.

Credentials come the way kubectl finds them: `--kubeconfig`, else $KUBECONFIG or ~/.kube/config
(the `kubernetes` client's load_kube_config), else the pod's service account when run inside a
cluster. The namespace, when none is given, is the current context's (else `default`), as kubectl
picks it. Every request has a timeout except a followed log, which ends when the container
does (its reader runs on a thread the caller bounds). This is the only module of the commands
that imports `kubernetes`; the others take a `Kube` (or a fake of it in the unit tests).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from rlkube.operator import api
from rlkube.operator.api.observed import TRAINER_CONTAINER

REQUEST_TIMEOUT_S = 30.0  # any one request; a followed log: to connect
# A followed log may be silent for long (a checkpoint, an evaluation); the client takes no
# unbounded read, so a day, the longest the commands follow by default.
FOLLOW_READ_TIMEOUT_S = 86400.0
IN_CLUSTER_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


class KubeError(RuntimeError):
    """A request the API server refused or that did not reach it; `status` is the HTTP status
    (0 when there was no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Kube:
    """A connection to the API server with the user's credentials."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        try:
            from kubernetes import client, config
        except ModuleNotFoundError:
            raise KubeError(0, "the kubernetes Python client is not installed: pip install 'rlkube[operator]'") from None
        if kubeconfig is not None and not os.path.isfile(kubeconfig):
            raise KubeError(0, f"--kubeconfig {kubeconfig}: no such file")
        try:
            config.load_kube_config(config_file=kubeconfig)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
            self.default_namespace = (active or {}).get("context", {}).get("namespace") or "default"
        except config.ConfigException as exc:
            if kubeconfig is not None or not os.path.exists(IN_CLUSTER_NAMESPACE):
                raise KubeError(0, f"no usable kubeconfig ({exc}); pass --kubeconfig or set KUBECONFIG") from None
            config.load_incluster_config()
            with open(IN_CLUSTER_NAMESPACE, encoding="utf-8") as f:
                self.default_namespace = f.read().strip() or "default"
        self._api = client.ApiClient()
        self._custom = client.CustomObjectsApi(self._api)
        self._core = client.CoreV1Api(self._api)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
        try:
            return fn(*args, **kwargs)
        except ApiException as exc:
            raise KubeError(exc.status or 0, f"{what}: {_api_message(exc)}") from None
        except (HTTPError, OSError) as exc:
            raise KubeError(0, f"{what}: cannot reach the API server ({exc})") from None

    def create_job(self, namespace: str, body: dict) -> dict:
        """Create an RLTrainingJob; KubeError(409) when one of that name exists."""
        return self._call(f"create {api.PLURAL}/{body['metadata']['name']}",
                          self._custom.create_namespaced_custom_object,
                          api.GROUP, api.VERSION, namespace, api.PLURAL, body)

    def get_job(self, namespace: str, name: str) -> dict | None:
        """The job as stored (status included), None when it does not exist."""
        try:
            return self._call(f"get {api.PLURAL}/{name}", self._custom.get_namespaced_custom_object,
                              api.GROUP, api.VERSION, namespace, api.PLURAL, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        """Pods matching a label selector, as plain dicts (camelCase, like kubectl's JSON)."""
        pods = self._call(f"list pods -l {selector}", self._core.list_namespaced_pod, namespace,
                          label_selector=selector)
        return self._api.sanitize_for_serialization(pods).get("items", [])

    def pod_log(self, namespace: str, pod: str, follow: bool) -> Iterator[str]:
        """The trainer container's log, line by line; with `follow`, until the container ends."""
        timeout = (REQUEST_TIMEOUT_S, FOLLOW_READ_TIMEOUT_S) if follow else REQUEST_TIMEOUT_S
        response = self._call(f"logs {pod}", self._core.read_namespaced_pod_log, pod, namespace,
                              container=TRAINER_CONTAINER, follow=follow, _preload_content=False,
                              _request_timeout=timeout)
        try:
            pending = b""
            for chunk in response.stream(4096, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            response.release_conn()


def _api_message(exc: Any) -> str:
    """The API server's own message (its Status body), else the HTTP reason."""
    import json

    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return f"{exc.status} {exc.reason}"
