"""A rule-based reward for arithmetic questions, the task of the calculator example
(examples/runtime/grpo-multi-turn-cpu.yaml): 1.0 when the episode's last turn ends with the value
of the question's expression, else 0.0.

The question is the prompt's last 'What is <expression>?'; the answer is the last number of the
episode's final turn (the text after its last tool turn), so a number the tool returned does not
count unless the policy says it again.
"""

from __future__ import annotations

import re

from rlkube.runtime.tools.calculator import evaluate

_QUESTION = re.compile(r"What is ([0-9+\-*/%(). ]+)\?")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# What a tool turn ends with in the byte tokenizer's chat format and in ChatML.
_NEXT_TURN = ("\nassistant: ", "<|im_start|>assistant\n")


def arithmetic_answer(prompt: str, completion: str) -> float:
    """1.0 when the last number of the final turn equals the question's value, else 0.0."""
    questions = _QUESTION.findall(prompt)
    if not questions:
        return 0.0
    try:
        want = float(evaluate(questions[-1]))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError):
        return 0.0
    final = completion
    for marker in _NEXT_TURN:
        final = final.rsplit(marker, 1)[-1]
    numbers = _NUMBER.findall(final)
    return 1.0 if numbers and abs(float(numbers[-1]) - want) < 1e-9 else 0.0
