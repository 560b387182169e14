"""commands/kube.py with the real `kubernetes` client against a small HTTP server on localhost that
answers the few requests `rlkube submit --follow` and `rlkube logs` make: the kubeconfig loaded,
the API server's own message passed on, a followed log read line by line (split across chunks)
with the client's timeouts accepted, and `submit --follow` printing rank 0's log before the
verdict. The server's answers are written here; the e2e test (tests/e2e/test_submit.py) runs
against a real API server."""

from __future__ import annotations

import io
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
import yaml

from rlkube.operator.commands import submit
from rlkube.operator.commands.kube import Kube, KubeError

JOBS = "/apis/rlkube.io/v1alpha1/namespaces/ns/rltrainingjobs"
POD = {"metadata": {"name": "dpo-actor-0", "uid": "u0", "labels": {"rlkube.io/pod-index": "0"},
                    "annotations": {"rlkube.io/ranks": "0"}},
       "status": {"phase": "Running", "containerStatuses": [
           {"name": "trainer", "ready": True, "restartCount": 0, "image": "i", "imageID": "",
            "state": {"running": {"startedAt": "2026-12-06T00:00:00Z"}}}]}}


class Api(BaseHTTPRequestHandler):
    """GET of job 'dpo' answers its statuses in turn; job 'gone' is 404; POST is 409."""

    statuses: list[dict] = []
    log_chunks = [b'{"step": 1}\n{"st', b'ep": 2}\n', b"done"]

    def log_message(self, *args) -> None:  # quiet
        pass

    def _json(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        url = urlparse(self.path)
        if url.path == f"{JOBS}/dpo":
            status = Api.statuses.pop(0) if len(Api.statuses) > 1 else Api.statuses[0]
            return self._json(200, {"apiVersion": "rlkube.io/v1alpha1", "kind": "RLTrainingJob",
                                    "metadata": {"name": "dpo", "namespace": "ns"}, "status": status})
        if url.path == "/api/v1/namespaces/ns/pods":
            return self._json(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": [POD]})
        if url.path == "/api/v1/namespaces/ns/pods/dpo-actor-0/log":
            assert "container=trainer" in url.query
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk in Api.log_chunks:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return None
        return self._json(404, {"kind": "Status", "status": "Failure", "reason": "NotFound",
                                "message": f'rltrainingjobs.rlkube.io "{url.path.rsplit("/", 1)[-1]}" not found'})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        name = json.loads(self.rfile.read(length))["metadata"]["name"]
        self._json(409, {"kind": "Status", "status": "Failure", "reason": "AlreadyExists",
                         "message": f'rltrainingjobs.rlkube.io "{name}" already exists'})


@pytest.fixture
def kubeconfig(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "c",
              "clusters": [{"name": "k", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
              "users": [{"name": "u", "user": {"token": "t"}}],
              "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "ns"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    yield str(path)
    server.shutdown()
    server.server_close()


def test_requests_and_their_errors(kubeconfig):
    Api.statuses = [{"phase": "Running"}]
    kube = Kube(kubeconfig)
    assert kube.default_namespace == "ns"
    assert kube.get_job("ns", "dpo")["status"] == {"phase": "Running"}
    assert kube.get_job("ns", "gone") is None
    with pytest.raises(KubeError) as caught:
        kube.create_job("ns", {"metadata": {"name": "dpo"}})
    assert caught.value.status == 409 and 'rltrainingjobs.rlkube.io "dpo" already exists' in str(caught.value)
    assert [p["metadata"]["name"] for p in kube.list_pods("ns", "rlkube.io/job=dpo")] == ["dpo-actor-0"]
    for follow in (False, True):
        assert list(kube.pod_log("ns", "dpo-actor-0", follow=follow)) == ['{"step": 1}', '{"step": 2}', "done"]
    with pytest.raises(KubeError, match="no such file"):
        Kube(kubeconfig + ".missing")


def test_submit_follow_prints_rank_0s_log_through_the_real_client(kubeconfig):
    Api.statuses = [{"phase": "Running"},
                    {"phase": "Succeeded", "progress": {"step": 2, "totalSteps": 2, "percent": 100.0}}]
    out, err = io.StringIO(), io.StringIO()
    code = submit.follow_job(Kube(kubeconfig), "ns", "dpo", 60.0, True, submit.Printer(out, "dpo"), err,
                             sleep=lambda s: None)
    assert code == 0, err.getvalue()
    assert out.getvalue().splitlines() == [
        "[dpo] phase Running",
        'dpo-actor-0 | {"step": 1}', 'dpo-actor-0 | {"step": 2}', "dpo-actor-0 | done",
        "[dpo] step 2/2 (100.0%)", "[dpo] job dpo succeeded",
    ]
