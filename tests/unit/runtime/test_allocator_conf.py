"""The runtime asks for expandable allocator segments unless the user configured the allocator."""

from rlkube.runtime.cli import use_expandable_segments


def test_expandable_segments_by_default(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    use_expandable_segments()
    import os

    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


def test_a_users_allocator_setting_is_kept(monkeypatch):
    import os

    for value in ("", "max_split_size_mb:512"):
        monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", value)
        use_expandable_segments()
        assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == value
