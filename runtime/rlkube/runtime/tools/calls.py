"""The tool-call format the policy writes, and its parser.

Accepted (the Qwen2.5 / Hermes format, which their chat templates teach):

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "2 + 3"}}
    </tool_call>

A turn that ends with the closing tag `</tool_call>` makes a call: the text between the last
`<tool_call>` of the turn and that closing tag, stripped, is one JSON object with a string "name"
and an "arguments" object (a JSON string holding an object is taken too, as some models write
it; missing arguments are {}). One call per turn: text before the last opening tag (reasoning,
an earlier call) is the policy's own and is not parsed. A call that does not parse is malformed:
the policy's mistake, answered with an error message as the tool's output (and counted), not a
failure of the executor.
"""

from __future__ import annotations

import json

from rlkube.runtime.tools.executor import ToolCall

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


class MalformedToolCall(ValueError):
    """A tool call the policy wrote that does not parse; the message says why."""


def parse_tool_call(turn: str) -> ToolCall:
    """The call at the end of `turn` (text ending with TOOL_CALL_CLOSE); MalformedToolCall otherwise."""
    body = turn.rstrip()
    if not body.endswith(TOOL_CALL_CLOSE):
        raise MalformedToolCall(f"the turn does not end with {TOOL_CALL_CLOSE}")
    body = body[: -len(TOOL_CALL_CLOSE)]
    start = body.rfind(TOOL_CALL_OPEN)
    if start < 0:
        raise MalformedToolCall(f"{TOOL_CALL_CLOSE} without {TOOL_CALL_OPEN}")
    text = body[start + len(TOOL_CALL_OPEN):].strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedToolCall(f"the call is not valid JSON: {e.msg}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        raise MalformedToolCall('the call must be a JSON object with a string "name"')
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            raise MalformedToolCall('"arguments" is a string that is not a JSON object') from None
    if not isinstance(arguments, dict):
        raise MalformedToolCall('"arguments" must be a JSON object')
    return ToolCall(name=obj["name"], arguments=arguments, text=text)
