"""The tool seam of multi-turn rollouts: the call format's parser, the in-process executor, the
tool turn's text from a chat template (and its fallbacks), the calculator stub."""

from __future__ import annotations

import pytest

from rlkube.runtime.data.tokenizer import ByteTokenizer, PretrainedTokenizer
from rlkube.runtime.tools import (
    FunctionTools,
    MalformedToolCall,
    ToolCall,
    ToolResult,
    ToolTurnFormat,
    load_tool_executor,
    parse_tool_call,
)
from rlkube.runtime.tools.calculator import calculator, evaluate
from tests.unit.runtime.data_builders import build_hf_tokenizer


@pytest.mark.parametrize(("turn", "name", "arguments"), [
    ('<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>',
     "calculator", {"expression": "2+3"}),
    # Qwen/Hermes layout: newlines inside the tags, reasoning before, trailing whitespace
    ('Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n',
     "add", {"a": 1, "b": 2}),
    ('<tool_call>{"name": "now"}</tool_call>', "now", {}),  # no arguments: {}
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', "f", {"x": 1}),  # arguments as a JSON string
    # only the last call of the turn is parsed
    ('<tool_call>{"name": "a"}</tool_call> then <tool_call>{"name": "b"}</tool_call>', "b", {}),
])
def test_parse_tool_call_accepts(turn, name, arguments):
    call = parse_tool_call(turn)
    assert (call.name, call.arguments) == (name, arguments)


@pytest.mark.parametrize(("turn", "why"), [
    ('{"name": "a"}', "does not end with"),
    ('{"name": "a"}</tool_call>', "without <tool_call>"),
    ("<tool_call>{name: a}</tool_call>", "not valid JSON"),
    ('<tool_call>["a"]</tool_call>', 'string "name"'),
    ('<tool_call>{"name": ""}</tool_call>', 'string "name"'),
    ('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', '"arguments" must be'),
    ('<tool_call>{"name": "a", "arguments": "nope"}</tool_call>', "not a JSON object"),
])
def test_parse_tool_call_refuses_with_the_reason(turn, why):
    with pytest.raises(MalformedToolCall, match=why):
        parse_tool_call(turn)


def test_function_tools_results_and_failures():
    def tool(name, arguments):
        if name == "boom":
            raise RuntimeError("sandbox died")
        if name == "end":
            return ToolResult("bye", done=True)
        if name == "int":
            return 3
        return f"{name}:{arguments['x']}"

    tools = FunctionTools(tool)
    assert tools.step("s0-0", ToolCall("echo", {"x": 1})) == ToolResult("echo:1")
    assert tools.step("s0-0", ToolCall("end")) == ToolResult("bye", done=True)
    failed = tools.step("s0-0", ToolCall("boom"))  # the executor's failure: ok False, never raised
    assert not failed.ok and "sandbox died" in failed.text
    assert not tools.step("s0-0", ToolCall("int")).ok  # not a str: a failure, named


def test_load_tool_executor_names_the_field():
    assert load_tool_executor("rlkube.runtime.tools.calculator:calculator").function is calculator
    with pytest.raises(ValueError, match="rollout.tools.function: cannot import"):
        load_tool_executor("no_such_module_xyz:f")
    with pytest.raises(ValueError, match="rollout.tools.function: .* has no callable 'nope'"):
        load_tool_executor("rlkube.runtime.tools.calculator:nope")


def test_calculator():
    assert calculator("calculator", {"expression": "(2 + 3) * 4"}) == "20"
    assert calculator("calculator", {"expression": "7 / 2"}) == "3.5"
    assert calculator("calculator", {"expression": "2 ** -1"}) == "0.5"
    # the policy's mistakes are answered, not raised
    assert calculator("calculator", {"expression": "1 / 0"}).startswith("error:")
    assert calculator("calculator", {"expression": "__import__('os')"}).startswith("error:")
    assert calculator("calculator", {"expression": "9 ** 999"}).startswith("error:")
    assert calculator("search", {"q": "x"}).startswith("error: unknown tool")
    assert calculator("calculator", {}).startswith("error:")
    with pytest.raises(ValueError):
        evaluate("a + 1")


def test_tool_turn_of_the_byte_tokenizer():
    fmt = ToolTurnFormat.of(ByteTokenizer())
    assert (fmt.source, fmt.text("42")) == ("template", "\ntool: 42\nassistant: ")
    assert fmt.tokens(ByteTokenizer(), "42") == list(b"\ntool: 42\nassistant: ")


def test_tool_turn_of_a_chatml_template(tmp_path):
    tok = PretrainedTokenizer(build_hf_tokenizer(tmp_path / "tok"))
    fmt = ToolTurnFormat.of(tok)
    assert fmt.source == "template"
    assert fmt.text("42") == "<|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    ids = fmt.tokens(tok, "42")
    # the turn markers are the tokenizer's special tokens, not spelled out in pieces
    assert ids[0] == tok.eos_id and tok._tok.convert_tokens_to_ids("<|im_start|>") in ids


class _NoToolRole(ByteTokenizer):
    def chat_text(self, messages, add_generation_prompt):
        if any(m["role"] == "tool" for m in messages):
            raise ValueError("Unexpected message role")
        return super().chat_text(messages, add_generation_prompt)


class _NoTemplate(ByteTokenizer):
    def chat_text(self, messages, add_generation_prompt):
        raise ValueError("no chat template")


def test_tool_turn_fallbacks():
    user = ToolTurnFormat.of(_NoToolRole())
    assert (user.source, user.text("42")) == ("user", "\nuser: <tool_response>\n42\n</tool_response>\nassistant: ")
    plain = ToolTurnFormat.of(_NoTemplate())
    assert (plain.source, plain.text("42")) == ("plain", "\ntool: 42\nassistant: ")


def test_arithmetic_reward_reads_the_final_turn():
    from rlkube.runtime.rewards.arithmetic import arithmetic_answer

    prompt = "system: use the calculator\nuser: What is 17 * 23?\nassistant: "
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "17 * 23"}}</tool_call>'
    assert arithmetic_answer(prompt, f"{call}\ntool: 391\nassistant: It is 391.") == 1.0
    # the tool's number alone does not count: the final turn must say it
    assert arithmetic_answer(prompt, f"{call}\ntool: 391\nassistant: I do not know.") == 0.0
    assert arithmetic_answer(prompt, "391") == 1.0 and arithmetic_answer(prompt, "390") == 0.0
    chatml = call + "<|im_end|>\n<|im_start|>tool\n391<|im_end|>\n<|im_start|>assistant\nSo 391"
    assert arithmetic_answer(prompt, chatml) == 1.0
    assert arithmetic_answer("no question here", "391") == 0.0
