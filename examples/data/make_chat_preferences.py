"""Writes chat-preferences.jsonl: a small conversational DPO dataset a tiny model can learn.

Each record asks the assistant to repeat a few made-up words, sometimes after a system message
and sometimes after an earlier exchange. The chosen answer repeats them in order. The rejected
one is a refusal in two records of three (a preference a tiny model learns in a few steps, which
the training test relies on) and the same words shuffled in the rest (which it can only learn by
looking back into the prompt). A third of the records leave `prompt` out (the implicit prompt TRL documents: the
messages chosen and rejected share). Run from anywhere; the output is the same for the same seed.

    python examples/data/make_chat_preferences.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 7
RECORDS = 300
SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "ve", "du"]
REFUSALS = ["I would rather not.", "No.", "Ask someone else."]
SYSTEM = {"role": "system", "content": "Repeat exactly."}


def word(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 2)))


def record(rng: random.Random) -> dict:
    words = [word(rng) for _ in range(rng.randint(2, 4))]
    shuffled = words[:]
    while shuffled == words:
        shuffled = rng.sample(words, len(words)) if len(set(words)) > 1 else [word(rng) for _ in words]
    prompt = [SYSTEM] if rng.random() < 0.5 else []
    if rng.random() < 0.3:
        earlier = [word(rng) for _ in range(2)]
        prompt += [{"role": "user", "content": "Repeat: " + " ".join(earlier)},
                   {"role": "assistant", "content": " ".join(earlier)}]
    prompt.append({"role": "user", "content": "Repeat: " + " ".join(words)})
    chosen = [{"role": "assistant", "content": " ".join(words)}]
    refusal = rng.choice(REFUSALS)
    rejected = [{"role": "assistant", "content": refusal if rng.random() < 2 / 3 else " ".join(shuffled)}]
    if rng.random() < 1 / 3:
        return {"chosen": prompt + chosen, "rejected": prompt + rejected}
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def main() -> None:
    rng = random.Random(SEED)
    out = Path(__file__).with_name("chat-preferences.jsonl")
    out.write_text("".join(json.dumps(record(rng)) + "\n" for _ in range(RECORDS)))
    print(f"wrote {RECORDS} records to {out}")


if __name__ == "__main__":
    main()
