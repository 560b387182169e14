"""Reading rank 0's training progress: `GET http://<pod IP>:<port>/progress`, with a short timeout.

The trainer never writes to the API server; the operator polls it on its resync timer and copies
the report into `status.progress`. A slow or absent trainer costs one short timeout and leaves the
last report in place (None here), never a stuck reconcile. The path, the port and the report's
fields are the contract's (`rlkube.runtime.contract.pod`, `rlkube.runtime.contract.progress`).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

from rlkube.runtime.contract.pod import PROGRESS_PATH

logger = logging.getLogger(__name__)

TIMEOUT_SECONDS = 2.0
MAX_BYTES = 64 * 1024
# Pod IPs are reached directly: an HTTP proxy from the environment must not be used for them.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def progress_url(pod_ip: str, port: int) -> str:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip  # IPv6 pod IPs need brackets in a URL
    return f"http://{host}:{port}{PROGRESS_PATH}"


def poll_progress(pod_ip: str | None, port: int, timeout: float = TIMEOUT_SECONDS) -> dict[str, Any] | None:
    """Rank 0's /progress JSON object, or None when there is no IP, no answer, or no JSON object."""
    if not pod_ip or not port:
        return None
    url = progress_url(pod_ip, port)
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            body = response.read(MAX_BYTES)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        logger.debug("progress poll %s failed: %s", url, exc)
        return None
    try:
        report = json.loads(body)
    except ValueError:
        logger.debug("progress poll %s: not JSON", url)
        return None
    return report if isinstance(report, dict) else None
