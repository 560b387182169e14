"""Conversations to token ids, with a loss mask that scores the assistant's turns only.

The chat template is applied prefix by prefix: the text a message adds is what rendering the
conversation up to it adds to rendering the conversation before it. For an assistant message the
generation prompt (the `<|im_start|>assistant\\n`-style header) is rendered first and masked, like
the prompt, system and user turns; the rest of what the message adds is scored: its text, its
end-of-turn tokens and any separator the template writes after them (a newline, say). Each
piece is tokenised on its own, so the mask lines up with the ids exactly (chat templates put
special tokens at the seams, where a tokeniser does not merge anyway; a sentencepiece tokenizer
that adds a leading space to every encode call would see one at each seam). This works with any
template that renders a conversation's prefix as the prefix of its rendering, which generation
itself relies on; a template that does not is reported, not guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkube.runtime.data.tokenizer import Tokenizer
from rlkube.runtime.infra.errors import DataError


@dataclass(frozen=True)
class RenderedChat:
    prompt: list[int]  # ids of the prompt, generation prompt included (never scored)
    completion: list[int]  # ids after the prompt
    mask: list[int]  # one per completion id: 1 = scored (assistant), 0 = not


def _pieces(tokenizer: Tokenizer, messages: list[dict], start: int) -> list[tuple[str, int]]:
    """(text, scored) pieces that messages[start:] add to the rendering of messages[:start]."""
    pieces: list[tuple[str, int]] = []
    done = tokenizer.chat_text(messages[:start], add_generation_prompt=False)
    for k in range(start, len(messages)):
        assistant = messages[k]["role"] == "assistant"
        if assistant:
            header = tokenizer.chat_text(messages[:k], add_generation_prompt=True)
            pieces.append((_added(done, header, k), 0))
            done = header
        text = tokenizer.chat_text(messages[: k + 1], add_generation_prompt=False)
        pieces.append((_added(done, text, k), int(assistant)))
        done = text
    return pieces


def _added(before: str, after: str, k: int) -> str:
    if not after.startswith(before):
        raise DataError(
            f"model.tokenizer: the chat template renders message {k} by changing the text of the "
            "messages before it, so assistant turns cannot be told apart for the loss mask"
        )
    return after[len(before):]


def render_chat(tokenizer: Tokenizer, prompt: list[dict], completion: list[dict]) -> RenderedChat:
    """Token ids of prompt + completion as the chat template renders them, with the loss mask."""
    generation = bool(completion) and completion[0]["role"] == "assistant"
    prompt_ids = tokenizer.encode(tokenizer.chat_text(prompt, add_generation_prompt=generation))
    ids: list[int] = []
    mask: list[int] = []
    pieces = _pieces(tokenizer, prompt + completion, len(prompt))
    if generation:
        # the first assistant header is already in the prompt text
        assert pieces[0][1] == 0, "an assistant message starts with its masked header"
        pieces = pieces[1:]
    for text, scored in pieces:
        piece = tokenizer.encode(text) if text else []
        ids.extend(piece)
        mask.extend([scored] * len(piece))
    return RenderedChat(prompt_ids, ids, mask)


def render_prompt(tokenizer: Tokenizer, prompt: list[dict]) -> tuple[str, list[int]]:
    """Text and ids of a conversation that asks for the assistant's next turn (PPO, GRPO)."""
    text = tokenizer.chat_text(prompt, add_generation_prompt=True)
    return text, tokenizer.encode(text)
