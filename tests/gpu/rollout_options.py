"""The `--refill` / `--decode-rows` options the rollout benchmarks share (bench_grpo, bench_utilization)."""

from __future__ import annotations


def rollout_settings(refill: str, decode_rows: int | None) -> list[tuple[str, dict]]:
    """(description, rollout section overrides) for each value of the comma list `refill`: 'all'
    leaves rollout.decodeRows unset (every row at once), 'on'/'off' set it to `decode_rows` with
    refill on or off."""
    out = []
    for value in [v for v in refill.split(",") if v]:
        if value == "all":
            out.append(("all rows at once", {}))
        elif value in ("on", "off"):
            if not decode_rows:
                raise SystemExit("--refill on/off needs --decode-rows")
            out.append((f"refill {value}, {decode_rows} rows", {"decodeRows": decode_rows, "refill": value == "on"}))
        else:
            raise SystemExit(f"--refill: all, on or off, got {value!r}")
    return out
