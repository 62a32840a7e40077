"""Value conditions: a rule that also looks at one argument of the call (`when amount > 500`).

A condition is `pointer op literal`: a JSON Pointer into the call's validated arguments (the
dumped form an approver sees; `amount` is short for `/amount`), one of `> >= < <= == !=`, and a
JSON literal (a number, a string in double quotes, `true`, `false`). Ordering operators
compare numbers only; `==` and `!=` compare numbers, strings and booleans.

What the arguments hold is the model's input: a value that cannot be compared (the argument is
missing, a string where a number is compared, NaN, a number too long to read) makes the
condition *unknown*, and an unknown condition errs toward the stricter verdict, like the rest of
the policy: a deny or ask rule matches, an allow rule does not. A string holding a plain decimal
number (`"900.50"`, what pydantic dumps a `Decimal` as) is compared as that number.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from handrail.errors import PolicyError

__all__ = ["Condition", "parse_pointer"]

_OPS = (">=", "<=", "==", "!=", ">", "<")
_ORDERING = frozenset({">", ">=", "<", "<="})
_TEXT = re.compile(
    r"^\s*(?P<pointer>[^\s<>=!]+)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<value>\S(?:.*\S)?)\s*$",
    re.DOTALL)
_NUMBER = re.compile(r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$")
_MAX_NUMBER_TEXT = 64
"""The longest number (as text) a condition reads: longer is unknown (a model's `1` followed by
a million zeros must not cost a conversion)."""
_MAX_SHOWN = 40
"""How much of an argument's value an explanation quotes."""
_MAX_LITERAL = 256
"""The longest string literal a rule may compare with."""
MAX_DEPTH = 16
"""The deepest JSON Pointer a condition may name."""


def parse_pointer(text: str) -> tuple[str, ...]:
    """The reference tokens of a JSON Pointer (RFC 6901); `amount` is taken as `/amount`.

    Raises:
        PolicyError: empty, an escape other than `~0`/`~1`, or deeper than 16 tokens.
    """
    if not isinstance(text, str) or not text or text == "/":
        raise PolicyError(f"a value condition needs an argument name or JSON Pointer, "
                          f"got {text!r}")
    body = text[1:] if text.startswith("/") else text
    tokens = []
    for raw in body.split("/"):
        if re.search(r"~(?![01])", raw):
            raise PolicyError(f"JSON Pointer {text!r}: '~' must be written '~0' ('~1' is '/')")
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    if len(tokens) > MAX_DEPTH or any(not t for t in tokens):
        raise PolicyError(f"JSON Pointer {text!r}: empty or more than {MAX_DEPTH} steps")
    return tuple(tokens)


def _pointer_text(tokens: tuple[str, ...]) -> str:
    return "/" + "/".join(t.replace("~", "~0").replace("/", "~1") for t in tokens)


def _literal(text: str) -> int | float | str | bool:
    if text == "true":
        return True
    if text == "false":
        return False
    if text.startswith('"'):
        if not (len(text) >= 2 and text.endswith('"')):
            raise PolicyError(f"unclosed string {text!r}: write it in double quotes, "
                              'e.g. currency == "EUR"')
        try:
            value = json.loads(text)
        except ValueError:
            raise PolicyError(f"malformed string {text!r} (JSON string escapes)") from None
        if not isinstance(value, str) or len(value) > _MAX_LITERAL:
            raise PolicyError(f"a string compared must be at most {_MAX_LITERAL} characters")
        return value
    if _NUMBER.match(text) and len(text) <= _MAX_NUMBER_TEXT:
        if re.fullmatch(r"-?[0-9]+", text):
            return int(text)
        number = float(text)
        if not math.isfinite(number):
            raise PolicyError(f"the number {text!r} is out of range")
        return number
    raise PolicyError(f"cannot read {text!r} as a value: write a number (500, 2.5), a string "
                      'in double quotes ("EUR"), true or false')


def _shown(value: Any) -> str:
    """A short, printable rendering of an argument's value (hostile: bounded, escaped)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value.bit_length() > 200:
            return "a number of more than 60 digits"
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        cut = value[:_MAX_SHOWN]
        text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in cut)
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        return '"' + text.replace('"', '\\"') + ('"' if len(value) <= _MAX_SHOWN else '..."')
    if value is None:
        return "null"
    return f"a{'n' if type(value).__name__[0] in 'aeiou' else ''} {_kind(value)}"


def _kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


_MISSING = object()


@dataclass(frozen=True, slots=True)
class Condition:
    """One value condition of a rule: `pointer op value` (`amount > 500`).

    Build it from text with `Condition.parse("amount > 500")`; `str(condition)` gives the
    text back (the pointer as written when it was a bare name).
    """

    pointer: tuple[str, ...]
    """The JSON Pointer's tokens into the validated arguments (`("amount",)`)."""
    op: str
    """One of `>`, `>=`, `<`, `<=`, `==`, `!=`."""
    value: int | float | str | bool
    """What the argument is compared with."""
    test: Callable[[Any], bool | None] = field(init=False, repr=False, compare=False)
    """`test(arguments)`: whether the condition holds, None when it cannot be decided (what
    `holds` says, without the explanation: the policy's hot path)."""
    why: Callable[[Any], tuple[bool | None, str]] = field(init=False, repr=False,
                                                          compare=False)
    """`why(arguments)`: what `holds` says (whether, and the explanation), specialised: a
    verdict's reason is built on every check a condition decided."""
    name: str = field(init=False, repr=False, compare=False)
    """The argument as a rule writes it: `amount`, or `/payee/country`."""
    literal: str = field(init=False, repr=False, compare=False)
    """The value as a rule writes it: `500`, `"EUR"`, `true`."""

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise PolicyError(f"unknown comparison {self.op!r}: one of {' '.join(_OPS)}")
        if self.op in _ORDERING and (isinstance(self.value, bool)
                                      or not isinstance(self.value, (int, float))):
            raise PolicyError(f"'{self.op}' compares numbers: {self.value!r} is not one "
                              "(a string or boolean is compared with == or !=)")
        if isinstance(self.value, float) and not math.isfinite(self.value):
            raise PolicyError("a value condition compares with a finite number")
        pointer = self.pointer
        if len(pointer) == 1 and "/" not in pointer[0] and "~" not in pointer[0]:
            name = pointer[0]
        else:
            name = _pointer_text(pointer)
        value = self.value
        literal = (("true" if value else "false") if isinstance(value, bool)
                   else json.dumps(value, ensure_ascii=False) if isinstance(value, str)
                   else repr(value))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "literal", literal)
        object.__setattr__(self, "test", _compile(self))
        object.__setattr__(self, "why", _compile_why(self))

    @classmethod
    def parse(cls, text: str) -> Condition:
        """`Condition.parse("amount > 500")`, `Condition.parse('/payee/country == "FR"')`.

        Raises:
            PolicyError: not `pointer op value`, with what to write instead.
        """
        if not isinstance(text, str):
            raise PolicyError(f"a value condition is text like 'amount > 500', not "
                              f"{type(text).__name__}")
        match = _TEXT.match(text)
        if match is None:
            raise PolicyError(f"cannot read the condition {text!r}: write 'argument op value' "
                              "with op one of > >= < <= == != (e.g. 'amount > 500')")
        pointer = parse_pointer(match["pointer"])
        try:
            return cls(pointer, match["op"], _literal(match["value"]))
        except PolicyError as exc:
            raise PolicyError(f"condition {text!r}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.name} {self.op} {self.literal}"

    def read(self, arguments: Any) -> Any:
        """The argument's value, or a private marker when it is not there."""
        value = arguments
        for token in self.pointer:
            if isinstance(value, Mapping):
                value = value.get(token, _MISSING)
            elif isinstance(value, (list, tuple)) and token.isdigit() and \
                    (token == "0" or not token.startswith("0")) and len(token) < 10:
                index = int(token)
                value = value[index] if index < len(value) else _MISSING
            else:
                return _MISSING
            if value is _MISSING:
                return _MISSING
        return value

    def holds(self, arguments: Any) -> tuple[bool | None, str]:
        """Whether the condition holds (None: unknown) and the explanation (`amount 900 > 500`).

        Never raises on what the arguments hold: everything not comparable is unknown.
        """
        value = self.read(arguments)
        if value is _MISSING:
            return None, f"{self.name} missing"
        left = _comparable(value, numeric=self.op in _ORDERING or (
            isinstance(self.value, (int, float)) and not isinstance(self.value, bool)))
        shown = _shown(value)
        if left is None:
            return None, f"{self.name} {shown}: not comparable with {self._literal_text()}"
        right = self.value
        if isinstance(left, (int, float, Decimal)) and not isinstance(left, bool):
            if isinstance(right, bool) or not isinstance(right, (int, float)):
                return self.op == "!=", f"{self.name} {shown} {self.op} {self._literal_text()}"
            result = _compare_numbers(left, self.op, right)
        else:
            if self.op in _ORDERING:  # pragma: no cover - a numeric op gets a number or None
                return None, f"{self.name} {shown}: not a number"
            same = type(left) is type(right) and left == right
            result = same if self.op == "==" else not same
        return result, f"{self.name} {shown} {self.op if result else _NOT[self.op]} " \
                       f"{self._literal_text()}"

    def _literal_text(self) -> str:
        return self.literal


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
    "==": operator.eq, "!=": operator.ne}


def _compile(condition: Condition) -> Callable[[Any], bool | None]:
    """`condition.holds` without its explanation, specialised.

    The common case, a top-level number argument, is a dict lookup and a compare.
    """
    op, right = condition.op, condition.value
    compare = _OPERATORS[op]
    read = condition.read
    key = condition.pointer[0] if len(condition.pointer) == 1 else None
    missing = _MISSING
    numeric = op in _ORDERING or (isinstance(right, (int, float)) and not isinstance(right, bool))
    if numeric:
        def test(arguments: Any) -> bool | None:
            value = (arguments.get(key, missing) if key is not None
                     and type(arguments) is dict else read(arguments))
            kind = type(value)
            if kind is int:
                return bool(compare(value, right))
            if kind is float:
                return None if value != value else bool(compare(value, right))
            if value is missing:
                return None
            number = _comparable(value, numeric=True)
            return None if number is None else _compare_numbers(number, op, right)  # type: ignore[arg-type]
        return test

    def test_equal(arguments: Any) -> bool | None:
        value = read(arguments)
        if value is missing:
            return None
        left = _comparable(value, numeric=False)
        if left is None:
            return None
        same = type(left) is type(right) and left == right
        return same if op == "==" else not same
    return test_equal


_NOT = {">": "<=", ">=": "<", "<": ">=", "<=": ">", "==": "!=", "!=": "=="}


def _compile_why(condition: Condition) -> Callable[[Any], tuple[bool | None, str]]:
    """`condition.holds`, specialised like `_compile`'s test.

    A top-level argument holding a plain number, compared with a number, is one lookup, one
    compare and one concatenation of precomputed text; anything else is `holds` itself.
    """
    holds = condition.holds
    right = condition.value
    if len(condition.pointer) != 1 or type(right) not in (int, float):
        return holds
    key, compare = condition.pointer[0], _OPERATORS[condition.op]
    head = f"{condition.name} "
    met = f" {condition.op} {condition.literal}"
    unmet = f" {_NOT[condition.op]} {condition.literal}"
    missing: Any = _MISSING

    def why(arguments: Any) -> tuple[bool | None, str]:
        value = arguments.get(key, missing) if type(arguments) is dict else missing
        kind = type(value)
        if (kind is int and value.bit_length() <= 200) or (kind is float and value == value):
            if compare(value, right):
                return True, head + (str(value) if kind is int else repr(value)) + met
            return False, head + (str(value) if kind is int else repr(value)) + unmet
        return holds(arguments)
    return why


def _comparable(value: Any, *, numeric: bool) -> Any:
    """`value` as compared, or None when it cannot be (NaN, an object, an unreadable number).

    A number, a string or a boolean; a decimal string is read as a number when `numeric`.
    """
    if isinstance(value, bool):
        return None if numeric else value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else value
    if isinstance(value, str):
        if not numeric:
            return value
        if len(value) > _MAX_NUMBER_TEXT or not _NUMBER.match(value):
            return None
        try:
            return Decimal(value)
        except InvalidOperation:  # pragma: no cover - the pattern admits only numbers
            return None
    return None


def _compare_numbers(left: int | float | Decimal, op: str, right: int | float) -> bool:
    if isinstance(left, Decimal):
        # Exact: Decimal(float) is the float's exact value, so 0.1 compares as it is stored.
        r: Any = Decimal(right)
    else:
        r = right
    if op == ">":
        return bool(left > r)
    if op == ">=":
        return bool(left >= r)
    if op == "<":
        return bool(left < r)
    if op == "<=":
        return bool(left <= r)
    if op == "==":
        return bool(left == r)
    return bool(left != r)
