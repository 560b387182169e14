"""The environment protocol: what an environment service (`roles.environment`) answers, over
HTTP with JSON bodies. Version 1; docs/environments.md is its reference.

  GET  /healthz   -> 200 {"status": "ok", "version": 1} once the service takes calls
  POST /v1/score  {"items": [{"prompt": str, "completion": str, "metadata": {...}}, ...]}
                  -> 200 {"rewards": [float | null, ...]}, one per item, in order; null: this
                     item could not be scored (the trainer leaves it out of the loss)
  POST /v1/step   {"episode_id": str, "action": str, "metadata": {...}?}
                  -> 200 {"observation": str, "done": bool, "reward": float | null?}

A non-2xx answer, a body that breaks these shapes or a timeout is a failed call: the client
retries it, and an item whose call still fails is reported as failed (never as a reward of 0).
Field names are snake_case on the wire here (they are not Kubernetes objects). Torch-free and
stdlib-only: the reference image's server imports nothing of rlkube, but follows this module.
"""

from __future__ import annotations

PROTOCOL_VERSION = 1
HEALTH_PATH = "/healthz"
SCORE_PATH = f"/v{PROTOCOL_VERSION}/score"
STEP_PATH = f"/v{PROTOCOL_VERSION}/step"

# Bounds every implementation may rely on (the client never sends more in one call).
MAX_ITEMS_PER_CALL = 256
