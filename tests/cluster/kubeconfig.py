"""Kubeconfig files for the admin, the controllers and each kubelet (client certificates)."""

from __future__ import annotations

import json
from pathlib import Path


def write(path: Path, *, server: str, ca: Path, cert: Path, key: Path, user: str) -> Path:
    """Write a one-context kubeconfig; JSON is valid YAML, so no YAML library is needed."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "rlkube", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "rlkube", "context": {"cluster": "rlkube", "user": user}}],
        "current-context": "rlkube",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path
