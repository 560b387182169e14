"""The env contract: launch mode, worker environments, the gang's exit code."""

import signal

from rlkube.runtime.infra.launch import gang_exit_code, launch_mode, pod_rank_env, worker_envs


def test_launch_mode():
    assert launch_mode({"RANK": "3", "LOCAL_WORLD_SIZE": "4"}) == "rank"  # torchrun or a worker
    assert launch_mode({"LOCAL_WORLD_SIZE": "4"}) == "spawn"
    assert launch_mode({"LOCAL_WORLD_SIZE": "1"}) == "single"
    assert launch_mode({}) == "single"
    # an operator pod of one GPU: its rank comes from RLKUBE_RANK_BASE, not a default of 0
    assert launch_mode({"LOCAL_WORLD_SIZE": "1", "RLKUBE_RANK_BASE": "1"}) == "pod"


def test_one_process_pods_take_their_rank_from_the_rank_base():
    env = {"LOCAL_WORLD_SIZE": "1", "RLKUBE_RANK_BASE": "1", "WORLD_SIZE": "2",
           "MASTER_ADDR": "job-actor-0.job.ns.svc", "MASTER_PORT": "29500"}
    assert pod_rank_env(env) == {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                                 "MASTER_ADDR": "job-actor-0.job.ns.svc", "MASTER_PORT": "29500"}


def test_worker_envs_follow_rank_base():
    env = {"LOCAL_WORLD_SIZE": "2", "RLKUBE_RANK_BASE": "4", "WORLD_SIZE": "8",
           "MASTER_ADDR": "job-0.job", "MASTER_PORT": "29500"}
    envs = worker_envs(env)
    assert [(e["RANK"], e["LOCAL_RANK"]) for e in envs] == [("4", "0"), ("5", "1")]
    assert all(e["WORLD_SIZE"] == "8" and e["MASTER_ADDR"] == "job-0.job" for e in envs)


def test_workstation_spawn_picks_loopback_and_a_port():
    envs = worker_envs({"LOCAL_WORLD_SIZE": "2"}, port=4242)
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert {e["MASTER_PORT"] for e in envs} == {"4242"}
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}


def test_gang_exit_code():
    assert gang_exit_code([0, 0], False) == 0
    assert gang_exit_code([0, 3], False) == 3
    assert gang_exit_code([-9, 4], False) == 4
    assert gang_exit_code([143, 143], True) == 143
    assert gang_exit_code([143, -signal.SIGTERM], True) == 143
    assert gang_exit_code([1, -9], False) == 1
    assert gang_exit_code([0, -9], False) == 137
