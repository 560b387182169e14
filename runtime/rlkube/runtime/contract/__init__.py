"""What the operator and the runtime agree on, in torch-free modules both sides import.

`config` is the run configuration (the spec sections the CRD embeds and the runtime reads);
`pod` the names that cross the pod boundary (env variables, config path, ports, exit codes, pod
labels); `progress` rank 0's /progress report and the status.progress field each of its fields
lands in; `field_path` the one way both sides name a field in an error. The operator imports
nothing of `rlkube.runtime` outside this package (import-linter checks it). docs/architecture.md
("The contract") draws the map.
"""
