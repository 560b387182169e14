"""The kind path's pure parts: which cluster RLKUBE_CLUSTER picks, kind's config, the node
image's containerd config (tests/cluster/kind.py, kindnode.py)."""

import json

import pytest

from tests.cluster import kind, kindnode
from tests.cluster.images import ImageArchive
from tests.cluster.layout import Layout, default_nodes, kind_state


@pytest.mark.parametrize(("value", "want"), [("kind", True), ("native", False)])
def test_rlkube_cluster_picks_the_backend(monkeypatch, value, want):
    monkeypatch.setenv("RLKUBE_CLUSTER", value)
    assert kind.selected() is want


def test_unknown_rlkube_cluster_is_refused_naming_the_variable(monkeypatch):
    monkeypatch.setenv("RLKUBE_CLUSTER", "kindd")
    with pytest.raises(ValueError, match="RLKUBE_CLUSTER must be kind, native or auto, got 'kindd'"):
        kind.selected()


def test_kind_state_is_apart_from_the_harness(monkeypatch):
    monkeypatch.delenv("RLKUBE_CLUSTER_DIR", raising=False)
    monkeypatch.setenv("RLKUBE_CLUSTER", "kind")
    assert Layout().state == kind_state()
    monkeypatch.delenv("RLKUBE_CLUSTER")
    assert Layout().state != kind_state()


@pytest.mark.parametrize("local_image", [True, False])
def test_kind_config_names_labels_and_shares_folders_as_the_harness(tmp_path, local_image):
    layout = Layout(state=tmp_path)
    cfg = json.loads(kind.config(layout, default_nodes(), local_image))
    assert cfg["networking"]["disableDefaultCNI"] is local_image  # kindnetd only with a registry image
    assert cfg["networking"]["apiServerPort"] != layout.apiserver_port
    control, *workers = cfg["nodes"]
    assert control == {"role": "control-plane"}
    assert len(workers) == 2
    for spec, worker in zip(default_nodes(), workers, strict=True):
        assert worker["labels"] == spec.labels
        assert f"name: {spec.name}" in worker["kubeadmConfigPatches"][0]
        shared = {"/var/lib/rlkube", "/var/lib/rlkube-e2e-pv", kind.EXAMPLE_DATA}
        assert {m["containerPath"] for m in worker["extraMounts"]} == shared


KIND_CONTAINERD = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
    SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.test-handler.options]
    SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = false
"""


def test_node_containerd_config_sets_pause_oom_and_runc_caps_once():
    out = kindnode._containerd_config(KIND_CONTAINERD)
    assert f'sandbox_image = "{kindnode.PAUSE}"' in out
    assert "restrict_oom_score_adj = true" in out
    assert out.count("runc-caps") == 1  # the runc runtime only, not the test handler


def test_node_containerd_config_of_another_shape_is_refused():
    with pytest.raises(RuntimeError, match="changed shape"):
        kindnode._containerd_config(KIND_CONTAINERD.replace("restrict_oom_score_adj = false", ""))


def test_images_go_into_one_worker_at_a_time_with_its_blobs_dropped_before_the_next(tmp_path, monkeypatch):
    """Both imports at once would hold the image's blobs and snapshots in both workers together."""
    calls = []
    containers = {f"c-{n.name}": n.name for n in default_nodes()}

    def kind_load(*args, env, **kw):
        calls.append(("load", args[args.index("--nodes") + 1]))

    monkeypatch.setattr(kind.docker_engine, "env", lambda: {})
    monkeypatch.setattr(kind, "_node_containers", lambda layout, env: containers)
    monkeypatch.setattr(kind, "_kind", kind_load)
    monkeypatch.setattr(
        kind, "_drop_layer_blobs", lambda container, ref, env: calls.append(("drop", container))
    )
    image = ImageArchive(ref="localhost/rlkube/runtime-cpu:dev", path=tmp_path / "a.tar", input_hash="h1")
    layout = Layout(state=tmp_path)
    kind.load_image(layout, image)
    first, second = containers
    assert calls == [("load", first), ("drop", first), ("load", second), ("drop", second)]
    calls.clear()
    kind.load_image(layout, image)  # both have this build: nothing is loaded again
    assert calls == []
