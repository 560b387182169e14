"""Fuzzing the spec: any input gives a valid spec or a ValidationError with field paths, nothing else."""

from __future__ import annotations

import copy
import typing

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from rltj_strategies import JSON, mutated_specs

from rlkube.operator import api


def _check(data: typing.Any) -> None:
    before = copy.deepcopy(data)
    try:
        parsed = api.parse_spec(data)
    except ValidationError:
        errors = api.spec_errors(data)
        assert errors, "a ValidationError must give at least one FieldError"
        for error in errors:
            assert error.path.startswith("spec"), error
            assert error.message.strip(), error
    else:
        assert api.spec_errors(data) == []
        # A valid spec has a consistent derived layout and makes a valid trainer config.
        assert parsed.total_gpus() % parsed.placement.gpus_per_pod == 0
        device_map = parsed.device_map()
        assert set(device_map) == set(parsed.roles.present())
        assert all(0 <= rank < parsed.total_gpus() for ranks in device_map.values() for rank in ranks)
        parsed.runtime_config()
    # repr, not ==: a generated float('nan') never equals itself, though nothing changed it
    assert repr(data) == repr(before), "validation must not modify its input"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_validate_or_raise_validation_error(data):
    _check(data)


@settings(max_examples=60, deadline=None)
@given(JSON)
def test_arbitrary_json_as_a_spec(data):
    _check(data)


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.sampled_from(["apiVersion", "kind", "metadata", "spec", "status", "x"]), JSON))
def test_arbitrary_objects(data):
    try:
        api.parse_job(data)
    except ValidationError:
        assert all(error.message for error in api.job_errors(data))
    else:
        assert api.job_errors(data) == []
