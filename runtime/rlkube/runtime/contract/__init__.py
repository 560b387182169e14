"""What the operator and the runtime agree on, in torch-free modules both sides import.

`config` is the run configuration (the spec sections the CRD embeds and the runtime reads), and
the other modules here hold the names that cross the pod boundary. The operator imports nothing of
`rlkube.runtime` outside this package (import-linter checks it).
"""
