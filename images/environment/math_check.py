"""The math answer checker of the reference environment: is a completion's final answer the
reference answer? Stdlib only.

The completion's answer is the content of its last \\boxed{...} (braces nested), else what follows
its last "answer is" or "####", else its last number. Both sides are normalised (TeX spacing and
delimiters, \\text{}, \\left/\\right, thousands separators, braces or parentheses around a number, a trailing full stop, \\frac and
\\dfrac as a/b, a percent sign) and compared as exact numbers where both parse as one (integers,
decimals, fractions a/b: 0.5 == 1/2 == \\frac{1}{2}, relative tolerance 1e-9 for decimals), else as
strings, case-insensitively.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+(?:\.\d+)?)?")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}) of `text`, braces balanced; None if none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth, begin = 1, i
    while i < len(text):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
        i += 1
    return None  # unbalanced: no answer


def extract_answer(completion: str) -> str | None:
    """The final answer a completion states, as the module says; None when it states none."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    for marker in ("####", "answer is"):
        at = completion.lower().rfind(marker)
        if at >= 0:
            tail = completion[at + len(marker):].strip().strip(":").strip()
            return tail.splitlines()[0] if tail else None
    numbers = _NUMBER.findall(completion.replace(",", ""))
    return numbers[-1] if numbers else None


def normalise(answer: str) -> str:
    """A canonical spelling of an answer, for comparison."""
    s = answer.strip()
    s = _TEXT.sub(r"\1", s)
    for old in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "$", "\\displaystyle"):
        s = s.replace(old, "")
    while True:
        replaced = _FRAC.sub(r"(\1)/(\2)", s)
        if replaced == s:
            break
        s = replaced
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)  # 1,000 -> 1000
    s = re.sub(r"^\((-?[\d.]+)\)/\((-?[\d.]+)\)$", r"\1/\2", s)
    if s.endswith("\\%") or s.endswith("%"):
        s = s.rstrip("%").rstrip("\\")
        value = as_number(s)
        if value is not None:
            return str(value / 100)
    if (s[:1], s[-1:]) in (("{", "}"), ("(", ")")) and as_number(s[1:-1]) is not None:
        s = s[1:-1]  # (2), {2}: a number in a group is the number
    return s.lower()


def as_number(s: str) -> Fraction | None:
    """`s` as an exact number (integer, decimal, or a/b), else None."""
    if not _NUMBER.fullmatch(s):
        return None
    try:
        if "/" in s:
            num, den = s.split("/")
            return Fraction(num) / Fraction(den) if Fraction(den) != 0 else None
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def equivalent(answer: str, reference: str) -> bool:
    """Whether two answers are the same, as the module says."""
    a, b = normalise(answer), normalise(reference)
    x, y = as_number(a), as_number(b)
    if x is not None and y is not None:
        return x == y or abs(x - y) <= Fraction(1, 10**9) * max(abs(x), abs(y))
    return a == b


def math_reward(completion: str, reference: str) -> float:
    """1.0 when the completion's final answer equals the reference, else 0.0."""
    answer = extract_answer(completion)
    return 1.0 if answer is not None and equivalent(answer, reference) else 0.0
