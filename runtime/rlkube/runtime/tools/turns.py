"""The tokens of a tool turn: how a tool's output is appended to an episode.

The policy's turn stops right after its closing `</tool_call>`; what follows is not the policy's:
the end of its turn, the tool's output as a turn of its own, and the header of the next assistant
turn, which together make the appended tokens (attended to, never trained on). They are taken from
the tokenizer's chat template, as the text that rendering [user, assistant, tool] with the
generation prompt adds after the assistant's content, the output's place marked. For a
ChatML template with a tool role that is

    <|im_end|>\n<|im_start|>tool\n{output}<|im_end|>\n<|im_start|>assistant\n

Fallbacks, in order (`ToolTurnFormat.source` says which was used):
- "template": the chat template renders a "tool" message (above);
- "user": it does not (it raises, or drops the message): the output goes in a user message as
  `<tool_response>\n{output}\n</tool_response>`, which is how Qwen2.5's own template renders tool
  messages;
- "plain": the tokenizer has no chat template: `\ntool: {output}\nassistant: `, the byte
  tokenizer's plain chat format (whose `chat_text` is exactly that).

The piece is tokenized on its own (as data/chat.py tokenizes each piece of a conversation), so
its tokens never merge with the policy's last ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkube.runtime.data.tokenizer import Tokenizer

_MARK = "TOOL_OUTPUT_PLACE_7f3a91"
_USER, _ASSISTANT = "Q", "A"
PLAIN_HEAD, PLAIN_FOOT = "\ntool: ", "\nassistant: "


@dataclass(frozen=True)
class ToolTurnFormat:
    """A tool turn is `head + output + foot`; `source` says where the format came from."""

    head: str
    foot: str
    source: str  # "template", "user" or "plain" (module docstring)

    def text(self, output: str) -> str:
        return self.head + output + self.foot

    def tokens(self, tokenizer: Tokenizer, output: str) -> list[int]:
        return tokenizer.encode(self.text(output))

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ToolTurnFormat:
        """The tool turn of `tokenizer`'s chat template (module docstring: the fallbacks)."""
        for source, message in (("template", {"role": "tool", "content": _MARK}),
                                ("user", {"role": "user", "content": f"<tool_response>\n{_MARK}\n</tool_response>"})):
            found = _around_mark(tokenizer, message)
            if found is not None:
                head, foot = found
                return cls(head, foot, source)
        return cls(PLAIN_HEAD, PLAIN_FOOT, "plain")


def _around_mark(tokenizer: Tokenizer, message: dict) -> tuple[str, str] | None:
    """(text before the output, text after it) that `message` adds after an assistant's content,
    the next generation prompt included; None where the template does not render it so."""
    try:
        before = tokenizer.chat_text([{"role": "user", "content": _USER}], add_generation_prompt=True) + _ASSISTANT
        full = tokenizer.chat_text([{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT},
                                    message], add_generation_prompt=True)
    except Exception:  # a template that refuses the role (jinja raises), or no template at all
        return None
    if not full.startswith(before) or full.count(_MARK) != 1:
        return None
    head, _, foot = full[len(before):].partition(_MARK)
    return head, foot
