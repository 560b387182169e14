"""The user's commands of the `rlkube` CLI: checking manifests (`validate`, and `submit` before it
sends anything), `submit [--follow]` and `logs`.

They run on a user's machine with the user's kubeconfig, beside the operator's process and never
imported by it. What they decide and print is pure (manifest.py, follow.py, pod_logs.py); only
kube.py talks to the API server. cli.py wires the verbs to these modules.
"""
