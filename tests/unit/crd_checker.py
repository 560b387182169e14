"""A test-only model of what the API server does with an object on create, for the generated CRD.

It applies the schema's defaults, then checks the structural schema (types, bounds, enums,
patterns, list types, unknown fields as `kubectl --validate=strict` reports them) and evaluates
the `x-kubernetes-validations` CEL rules. The CEL evaluator covers only the subset of CEL that
`rlkube.operator.api.crd` emits (has(), member access, && || ! ?:, comparisons, + - * / %, `in`,
string, int and double literals, double(), and the all/exists/exists_one macros); it raises on anything
else, so a rule outside the subset fails the tests instead of passing unchecked. Transition rules
(those naming oldSelf) are skipped: they only run on update.

This is no substitute for a real API server (a later integration test applies the CRD to one);
it makes the agreement between the pydantic validators and the CRD's rules a fast unit test.
"""

from __future__ import annotations

import copy
import functools
import re
from typing import Any

from rlkube.operator.api.pod_spec import quantity_value

# ---------------------------------------------------------------------------------------------
# Defaulting and structural validation
# ---------------------------------------------------------------------------------------------


def go_regex(pattern: str) -> str:
    """`pattern` for Python's re as the API server's Go regexp reads it: an unescaped '$' is the
    end of the text, where Python's also matches before a final newline (no pattern of the CRD
    has a '$' inside a character class)."""
    return re.sub(r"(?<!\\)\$", r"\\Z", pattern)


def apply_defaults(value: Any, schema: dict) -> Any:
    """`value` with nulls pruned and the schema's defaults filled in, as the API server does."""
    value = _prune_nulls(copy.deepcopy(value), schema)
    _default_in_place(value, schema)
    return value


def _prune_nulls(value: Any, schema: dict) -> Any:
    """Drop null-valued fields (none of the schema is nullable); free-form objects keep theirs.

    Unknown fields given null are dropped too, as `rlkube.operator.api.drop_nulls` does (the
    API server's strict field validation would name them; a null carries nothing either way).
    """
    if isinstance(value, dict) and "properties" in schema:
        props = schema["properties"]
        return {
            key: _prune_nulls(item, props[key]) if key in props else item
            for key, item in value.items()
            if not (item is None and not props.get(key, {}).get("nullable"))
        }
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        values = schema["additionalProperties"]
        return {
            key: _prune_nulls(item, values)
            for key, item in value.items()
            if not (item is None and not values.get("nullable"))
        }
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [_prune_nulls(item, schema["items"]) for item in value]
    return value


def _default_in_place(value: Any, schema: dict) -> None:
    if isinstance(value, dict) and "properties" in schema:
        for key, sub in schema["properties"].items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                _default_in_place(value[key], sub)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for item in value.values():
            _default_in_place(item, schema["additionalProperties"])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default_in_place(item, schema["items"])


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    raise ValueError(f"unknown schema type {kind}")


def _size_errors(path: str, size: int, schema: dict, unit: str, words: tuple[str, str]) -> list[str]:
    """A string's length or a list's items against the schema's max{unit} and min{unit}."""
    high, low = schema.get(f"max{unit}"), schema.get(f"min{unit}")
    return [f"{path}: {word} {bound}" for word, bound, out in
            ((words[0], high, high is not None and size > high), (words[1], low, low is not None and size < low)) if out]


def validate(value: Any, schema: dict, path: str = "") -> list[str]:
    """Errors of an already defaulted `value` against `schema` (structural checks, then CEL)."""
    errors: list[str] = []
    kind = schema.get("type")
    if kind is not None and not _type_ok(value, kind):
        return [f"{path}: must be of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: must be one of {schema['enum']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low = schema["minimum"]
            if value < low or (schema.get("exclusiveMinimum") and value == low):
                errors.append(f"{path}: below minimum {low}")
        if "maximum" in schema:
            high = schema["maximum"]
            if value > high or (schema.get("exclusiveMaximum") and value == high):
                errors.append(f"{path}: above maximum {high}")
    if isinstance(value, str):
        errors += _size_errors(path, len(value), schema, "Length", ("longer than", "shorter than"))
        if "pattern" in schema and not re.search(go_regex(schema["pattern"]), value):
            errors.append(f"{path}: does not match {schema['pattern']}")
    if isinstance(value, list):
        errors += [f"{e} items" for e in _size_errors(path, len(value), schema, "Items", ("more than", "fewer than"))]
        list_type = schema.get("x-kubernetes-list-type")
        if list_type == "set" and len({repr(v) for v in value}) != len(value):
            errors.append(f"{path}: duplicate items in a set")
        if list_type == "map":
            keys = [tuple(repr(item.get(k)) for k in schema["x-kubernetes-list-map-keys"]) for item in value
                    if isinstance(item, dict)]
            if len(set(keys)) != len(keys):
                errors.append(f"{path}: duplicate map keys")
        for index, item in enumerate(value):
            errors += validate(item, schema["items"], f"{path}[{index}]")
    if isinstance(value, dict):
        if len(value) > schema.get("maxProperties", 10**9):
            errors.append(f"{path}: more than {schema['maxProperties']} properties")
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}.{key}: required")
        props = schema.get("properties")
        if props is not None:
            for key, item in value.items():
                if key in props:
                    errors += validate(item, props[key], f"{path}.{key}")
                elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                    errors.append(f"{path}.{key}: unknown field")
        elif isinstance(schema.get("additionalProperties"), dict):
            for key, item in value.items():
                errors += validate(item, schema["additionalProperties"], f"{path}.{key}")
    if errors:
        return errors  # the API server does not run CEL on a node whose schema check failed
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        try:
            holds = evaluate(rule["rule"], {"self": value}) is True
        except CelRuntimeError as exc:
            holds, rule = False, {**rule, "message": f"{exc} evaluating rule: {rule['message']}"}
        if not holds:
            errors.append(f"{path}{rule.get('fieldPath', '')}: {rule['message']}")
    return errors


# ---------------------------------------------------------------------------------------------
# The CEL subset
# ---------------------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<float>\d+\.\d+(?:[eE][-+]?\d+)?)|(?P<int>\d+)|(?P<str>'(?:[^'\\]|\\.)*')"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|[-+*/%<>!?:().,\[\]]))"
)
# The few methods of the Kubernetes CEL libraries the CRD's rules use (strings, quantities).
_METHODS = {
    "matches": lambda target, pattern: re.search(go_regex(pattern), target) is not None,
    "startsWith": lambda target, prefix: target.startswith(prefix),
    "endsWith": lambda target, suffix: target.endswith(suffix),
    "contains": lambda target, part: part in target,
    "compareTo": lambda left, right: (left > right) - (left < right),
}
_BINARY = {
    "||": 1, "&&": 2,
    "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3,
    "+": 4, "-": 4,
    "*": 5, "/": 5, "%": 5,
}
_MACROS = ("all", "exists", "exists_one")


class CelError(Exception):
    """An expression outside the supported subset (a test failure, not a validation error)."""


class CelRuntimeError(CelError):
    """An evaluation error (no such key, division by zero): the API server reports the rule failed."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match or match.end() == pos:
            raise CelError(f"cannot tokenize at {text[pos:]!r}")
        kind = match.lastgroup
        out.append((kind, match.group(kind)))  # type: ignore[arg-type]
        pos = match.end()
    return out


def evaluate(text: str, env: dict[str, Any]) -> Any:
    """Value of the CEL expression `text` with variables `env`."""
    return _eval(_parse(text), env)


@functools.lru_cache(maxsize=1024)
def _parse(text: str) -> tuple:
    parser = _Parser(_tokens(text))
    tree = parser.expression()
    if parser.pos != len(parser.tokens):
        raise CelError(f"trailing tokens in {text!r}")
    return tree


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.pos = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise CelError("unexpected end")
        token = self.tokens[self.pos]
        if expected is not None and token[1] != expected:
            raise CelError(f"expected {expected!r}, got {token[1]!r}")
        self.pos += 1
        return token

    def expression(self) -> tuple:
        condition = self.binary(1)
        if self.peek() == "?":
            self.take("?")
            then = self.expression()
            self.take(":")
            return ("?", condition, then, self.expression())
        return condition

    def binary(self, level: int) -> tuple:
        left = self.unary()
        while (op := self.peek()) in _BINARY and _BINARY[op] >= level:  # type: ignore[operator]
            self.take()
            left = ("bin", op, left, self.binary(_BINARY[op] + 1))  # type: ignore[index]
        return left

    def unary(self) -> tuple:
        if self.peek() == "!":
            self.take()
            return ("not", self.unary())
        if self.peek() == "-":
            self.take()
            return ("neg", self.unary())
        return self.postfix(self.primary())

    def primary(self) -> tuple:
        kind, text = self.take()
        if kind == "int":
            return ("lit", int(text))
        if kind == "float":
            return ("lit", float(text))
        if kind == "str":
            return ("lit", text[1:-1].replace("\\'", "'"))
        if text == "(":
            inner = self.expression()
            self.take(")")
            return inner
        if kind == "name":
            if text in ("true", "false"):
                return ("lit", text == "true")
            if text in ("quantity", "double"):
                self.take("(")
                argument = self.expression()
                self.take(")")
                return (text, argument)
            if text == "has":
                self.take("(")
                target = self.postfix(self.primary())
                self.take(")")
                if target[0] != "member":
                    raise CelError("has() needs a field selection")
                return ("has", target)
            return ("var", text)
        raise CelError(f"unexpected {text!r}")

    def postfix(self, node: tuple) -> tuple:
        while self.peek() == ".":
            self.take(".")
            _, name = self.take()
            if self.peek() == "(":
                self.take("(")
                if name in _MACROS:
                    _, variable = self.take()
                    self.take(",")
                    body = self.expression()
                    self.take(")")
                    node = ("macro", name, node, variable, body)
                elif name == "size":
                    self.take(")")
                    node = ("size", node)
                elif name in _METHODS:
                    argument = self.expression()
                    self.take(")")
                    node = ("method", name, node, argument)
                else:
                    raise CelError(f"unsupported function {name}")
            else:
                node = ("member", node, name)
        return node


def _eval(node: tuple, env: dict[str, Any]) -> Any:
    tag = node[0]
    if tag == "lit":
        return node[1]
    if tag == "var":
        if node[1] not in env:
            raise CelError(f"undeclared {node[1]}")
        return env[node[1]]
    if tag == "member":
        target = _eval(node[1], env)
        if not isinstance(target, dict) or node[2] not in target:
            raise CelRuntimeError(f"no such key {node[2]}")
        return target[node[2]]
    if tag == "has":
        target = _eval(node[1][1], env)
        return isinstance(target, dict) and node[1][2] in target
    if tag == "not":
        return not _bool(_eval(node[1], env))
    if tag == "neg":
        return -_eval(node[1], env)
    if tag == "size":
        return len(_eval(node[1], env))
    if tag == "double":
        value = _eval(node[1], env)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CelError(f"double() of {value!r}")
        return float(value)
    if tag == "quantity":
        value = quantity_value(_eval(node[1], env))
        if value is None:
            raise CelRuntimeError("invalid quantity")
        return value
    if tag == "method":
        _, name, target_node, argument_node = node
        target, argument = _eval(target_node, env), _eval(argument_node, env)
        return _METHODS[name](target, argument)
    if tag == "?":
        return _eval(node[2], env) if _bool(_eval(node[1], env)) else _eval(node[3], env)
    if tag == "macro":
        _, name, target, variable, body = node
        items = _eval(target, env)
        results = [_bool(_eval(body, {**env, variable: item})) for item in items]
        return {"all": all, "exists": any}.get(name, lambda r: sum(r) == 1)(results)
    if tag == "bin":
        _, op, left_node, right_node = node
        if op == "&&":
            return _bool(_eval(left_node, env)) and _bool(_eval(right_node, env))
        if op == "||":
            return _bool(_eval(left_node, env)) or _bool(_eval(right_node, env))
        left, right = _eval(left_node, env), _eval(right_node, env)
        if op in ("/", "%"):
            if right == 0:
                raise CelRuntimeError("division by zero")
            quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
            return quotient if op == "/" else left - right * quotient
        return {
            "==": lambda: left == right, "!=": lambda: left != right,
            "<": lambda: left < right, "<=": lambda: left <= right,
            ">": lambda: left > right, ">=": lambda: left >= right,
            "+": lambda: left + right, "-": lambda: left - right, "*": lambda: left * right,
            "in": lambda: left in right,
        }[op]()
    raise CelError(f"unknown node {tag}")


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise CelRuntimeError(f"expected a bool, got {value!r}")
    return value


def names(error: str, path: str) -> bool:
    """Whether an `admit` error names `path` ('spec.training.kl', or a part of one as a bad
    manifest's '# expect:' line may give it): in its location, or, for a CEL rule on a parent
    object, in the path its message starts with."""
    location, _, message = error.partition(": ")
    return path in location or path.removeprefix("spec.") in message.partition(": ")[0]


def admit(obj: dict, crd: dict) -> list[str]:
    """Errors the API server would report on creating `obj` (an RLTrainingJob dict)."""
    schema = _prepared(crd)
    return validate(apply_defaults(obj, schema), schema)


_PREPARED: dict[int, tuple[dict, dict]] = {}


def _prepared(crd: dict) -> dict:
    """The CRD's root schema, ready for `validate` (copied once per CRD object)."""
    if id(crd) not in _PREPARED:
        schema = copy.deepcopy(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        # The API server validates the rest of ObjectMeta itself; the CRD restricts only the name.
        schema["properties"]["metadata"]["x-kubernetes-preserve-unknown-fields"] = True
        _PREPARED[id(crd)] = (crd, schema)  # keeps crd alive, so its id is not reused
    return _PREPARED[id(crd)][1]
