"""The operator's lifecycle settings come from its flags of the same names."""

from rlkube.operator.lifecycle import Settings
from rlkube.operator.main import parse_args, settings_from


def test_every_setting_is_a_flag_and_defaults_to_the_settings_default():
    settings = settings_from(parse_args([]))
    assert isinstance(settings, Settings)
    # The status coalescing interval is the one flag whose default differs from the dataclass's.
    assert settings.backoff_base_seconds == Settings.backoff_base_seconds
    assert settings.status_coalesce_seconds == 2.0


def test_flags_reach_the_settings():
    args = parse_args(["--backoff-base-seconds", "3", "--node-lost-counts", "--host-path-shared",
                       "--status-coalesce-seconds", "0"])
    settings = settings_from(args)
    assert (settings.backoff_base_seconds, settings.node_lost_counts, settings.host_path_shared,
            settings.status_coalesce_seconds) == (3.0, True, True, 0.0)


def test_the_compile_cache_volume_flags_reach_the_settings():
    import pytest

    settings = settings_from(parse_args(["--compile-cache-claim", "team-cache", "--compile-cache-path", "/cache"]))
    assert (settings.compile_cache_claim, settings.compile_cache_host_path, settings.compile_cache_path) == (
        "team-cache", "", "/cache")
    assert settings_from(parse_args([])).compile_cache_claim == ""
    with pytest.raises(SystemExit):  # a claim or a hostPath, not both
        parse_args(["--compile-cache-claim", "c", "--compile-cache-host-path", "/h"])
