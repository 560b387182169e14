"""Planning: where a job's gang goes. Pure.

`inventory` is the cluster's GPU inventory (nodes, the GPUs pods hold or are planned to take,
the jobs waiting for a plan, one snapshot of all of it); `placement` plans one gang on it
(ranks into pods, pods onto nodes, the tightest topology domain); `cluster` is one job's view of
the inventory with the two questions the lifecycle asks (the largest plan that fits, whether a
plan still fits); `fifo` serves older waiting jobs first. Planning reads the API types
(`rlkube.operator.api`) and nothing above them.
"""
