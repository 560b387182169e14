"""A small stdlib HTTPS client for the test apiserver (client-certificate auth, JSON).

The harness itself must run before any virtualenv exists (`make cluster-up` on a fresh
machine), so it cannot use the kubernetes Python client; this is the little it needs:
get, list, create, patch, delete and readiness probes.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Client:
    def __init__(self, server: str, ca: Path, cert: Path, key: Path, timeout: float = 10.0):
        self.server = server.rstrip("/")
        self.timeout = timeout
        self._ctx = ssl.create_default_context(cafile=str(ca))
        self._ctx.load_cert_chain(str(cert), str(key))

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            text = err.read().decode(errors="replace")
            try:
                text = json.loads(text).get("message", text)
            except ValueError:
                pass
            raise ApiError(err.code, text) from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode(errors="replace")

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any, kind: str = "merge") -> Any:
        types = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
        return self.request("PATCH", path, body, types[kind])

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def healthy(self, endpoint: str = "/readyz") -> bool:
        try:
            return self.request("GET", endpoint) == "ok"
        except (OSError, ApiError, ssl.SSLError):
            return False


class ProcessExited(RuntimeError):
    """A process the harness waits on has died: waiting longer cannot help."""


def wait_for(what: str, condition, timeout: float, interval: float = 0.25, diagnose=None):
    """Poll `condition()` until it returns a truthy value; raise TimeoutError naming `what`.

    Errors raised by `condition` are retried (the thing may not be up yet), except
    ProcessExited, which ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last_err: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = condition()
            if value:
                return value
        except ProcessExited:
            raise
        except Exception as err:  # noqa: BLE001 - reported below if the wait times out
            last_err = err
        time.sleep(interval)
    detail = f" (last error: {last_err})" if last_err else ""
    extra = f"\n{diagnose()}" if diagnose else ""
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
