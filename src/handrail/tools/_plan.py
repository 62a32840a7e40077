"""A plan: the world-changing calls a run's task commits to before any tool output is read.

Plan-then-execute (docs/taint.md): the decision to make a mutating call is data with a
provenance too. A plan written on the task alone (by the user, the app, or a model turn that
saw no tool output) is trusted text; each of its `Step`s names a tool (a CALL pattern) and,
optionally, the values some of its arguments must have. The gate asks about an allowed
mutating call that no step covers: a tool the plan never named, or a named tool called with
an argument the plan fixed to something else (an injected calendar event titled by a page,
where the plan said `title="Dinner at *"`).

The argument values are matched here; the tool patterns by the gate (the policy's CALL
globs), which also validates them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from handrail.errors import UserError
from handrail.tools._taint import normalise, pointer_problem

MAX_STEPS = 256
"""Steps a plan may hold: a plan is read by a person and checked on every mutating call."""

MAX_PLAN_CHARS = 64 * 1024
"""The JSON size of a plan's fixed values at most (they are matched on every call)."""

_MAX_DEPTH = 16
"""How deep a fixed value may nest (a list of lists ...)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Miss:
    """Why a call is outside its run's plan: for a person, and for the taint lines."""

    tool: str
    """The call's tool (`server/name`)."""
    pointer: str | None
    """The argument whose value the plan fixed differently; None: no step names the tool."""
    planned: Any = None
    """The value (or `*` pattern) the closest step fixed at `pointer`."""
    value: Any = None
    """The call's value there (None when the argument is missing)."""

    def describe(self, steps: Sequence[Step]) -> str:
        """One line saying what the plan allowed and what the call did instead."""
        if self.pointer is None:
            named = ", ".join(s.tool for s in steps) if steps else "no tool"
            return (f"plan: no step of this run's plan calls {self.tool} (the plan changes the "
                    f"world with {named} only)")
        shown = repr(self.value)
        if len(shown) > 200:
            shown = shown[:200] + f"... ({len(shown)} characters)"
        return (f"plan: the plan calls {self.tool} with {self.pointer} = {self.planned!r}; this "
                f"call has {self.pointer} = {shown}")


@dataclass(frozen=True, slots=True)
class Step:
    """One world-changing call a plan commits to.

    ```python
    hr.Step("calendar/create_event", {"title": "Dinner at *", "day": "2024-11-14"})
    ```

    `arguments` maps an argument's name (or a JSON Pointer into the arguments, `/to/0`) to
    the value it must have. A string is a pattern: `*` stands for any run of characters,
    the rest matches as written, after the taint index's normalisation (letter case, HTML
    character references, invisible characters do not matter); a number matches by value;
    a list or an object matches element by element. An argument the step does not name is
    free: its value may come from what tools returned (a restaurant the model looked up).
    """

    tool: str
    """The tool, as a CALL pattern (`mail/send`, `calendar/*`)."""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    """Argument name or JSON Pointer -> the value (or `*` pattern) it must have."""

    def __post_init__(self) -> None:
        if not isinstance(self.tool, str) or "/" not in self.tool:
            raise UserError(f"hr.Step: {self.tool!r} is not a tool pattern ('server/name')")
        if not isinstance(self.arguments, Mapping):
            raise UserError(f"hr.Step({self.tool!r}): arguments takes a mapping of argument "
                            "names (or JSON Pointers) to values, e.g. {'to': 'bob@corp.example'}")
        fixed: dict[str, Any] = {}
        for key, value in self.arguments.items():
            if not isinstance(key, str) or not key:
                raise UserError(f"hr.Step({self.tool!r}): {key!r} is not an argument name")
            pointer = key if key.startswith("/") else "/" + key.replace("~", "~0").replace(
                "/", "~1")
            problem = pointer_problem(pointer)
            if problem:
                raise UserError(f"hr.Step({self.tool!r}): {problem}")
            _check_value(self.tool, pointer, value, 0)
            fixed[pointer] = value
        object.__setattr__(self, "arguments", fixed)

    def miss(self, arguments: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
        """The first fixed argument `arguments` breaks: (pointer, planned, value), or None."""
        for pointer, planned in self.arguments.items():
            found, value = _at(arguments, pointer)
            if not found or not _matches(planned, value):
                return pointer, planned, value if found else None
        return None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form, recorded with the run."""
        return {"tool": self.tool, "arguments": dict(self.arguments)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Step:
        """The inverse of `to_dict`."""
        return cls(str(data["tool"]), dict(data.get("arguments") or {}))


@dataclass(frozen=True, slots=True)
class Plan:
    """The world-changing calls a run may make, committed to before any tool output.

    `Agent.run(task, plan=...)` takes one (or a list of `Step`s); an allowed mutating call
    that no step covers asks (`Policy.with_taint("deny")`: it is denied). Calls that change
    nothing are not held to it; an empty plan means the task changes nothing at all.
    """

    steps: tuple[Step, ...] = ()
    """The calls the plan commits to, in any order; each may be used any number of times."""

    def __post_init__(self) -> None:
        if isinstance(self.steps, str | Step) or not isinstance(self.steps, Sequence):
            raise UserError("hr.Plan takes a list of hr.Step, e.g. "
                            "[hr.Step('mail/send', {'to': 'bob@corp.example'})]")
        steps = tuple(self.steps)
        for step in steps:
            if not isinstance(step, Step):
                raise UserError(f"hr.Plan: {step!r} is not an hr.Step")
        if len(steps) > MAX_STEPS:
            raise UserError(f"hr.Plan: {len(steps)} steps, at most {MAX_STEPS}")
        if len(repr([s.arguments for s in steps])) > MAX_PLAN_CHARS:
            raise UserError(f"hr.Plan: its fixed values exceed {MAX_PLAN_CHARS} characters")
        object.__setattr__(self, "steps", steps)

    @classmethod
    def of(cls, value: object) -> Plan:
        """`Agent.run(plan=...)`'s value as a `Plan` (a Plan, or a list of `Step`s)."""
        if isinstance(value, Plan):
            return value
        if isinstance(value, str | bytes) or not isinstance(value, Sequence):
            raise UserError("plan= takes an hr.Plan or a list of hr.Step, e.g. "
                            "[hr.Step('mail/send', {'to': 'bob@corp.example'})]")
        return cls(tuple(value))

    def miss(self, tool: str, steps: Sequence[Step], arguments: Mapping[str, Any]) -> Miss | None:
        """Why a call of `tool` with `arguments` is outside the plan, or None if a step covers it.

        `steps` are this plan's steps whose tool pattern covers `tool` (the gate matched them).
        """
        closest: tuple[str, Any, Any] | None = None
        for step in steps:
            missed = step.miss(arguments)
            if missed is None:
                return None
            closest = closest or missed
        if closest is None:
            return Miss(tool=tool, pointer=None)
        pointer, planned, value = closest
        return Miss(tool=tool, pointer=pointer, planned=planned, value=value)

    def to_dict(self) -> list[dict[str, Any]]:
        """A JSON-compatible form, recorded with the run."""
        return [s.to_dict() for s in self.steps]

    @classmethod
    def from_dict(cls, data: Sequence[Mapping[str, Any]]) -> Plan:
        """The inverse of `to_dict`."""
        return cls(tuple(Step.from_dict(s) for s in data))


def _check_value(tool: str, pointer: str, value: Any, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise UserError(f"hr.Step({tool!r}): {pointer}: nested deeper than {_MAX_DEPTH}")
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"hr.Step({tool!r}): {pointer}: {value!r} is not a JSON number")
        return
    if isinstance(value, list | tuple):
        for item in value:
            _check_value(tool, pointer, item, depth + 1)
        return
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        for item in value.values():
            _check_value(tool, pointer, item, depth + 1)
        return
    raise UserError(f"hr.Step({tool!r}): {pointer}: {value!r} is not a JSON value")


def _at(document: Any, pointer: str) -> tuple[bool, Any]:
    """The value at `pointer` in `document`: (found, value)."""
    here = document
    for raw in pointer.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(here, Mapping):
            if token not in here:
                return False, None
            here = here[token]
        elif isinstance(here, list) and token.isdigit() and int(token) < len(here):
            here = here[int(token)]
        else:
            return False, None
    return True, here


def _matches(planned: Any, value: Any) -> bool:
    """Whether a call's `value` is what the plan fixed (`*` patterns, numbers by value)."""
    if isinstance(planned, str):
        return isinstance(value, str) and _glob(planned, value)
    if isinstance(planned, bool) or planned is None:
        return value is planned
    if isinstance(planned, int | float):
        return isinstance(value, int | float) and not isinstance(value, bool) and \
            value == planned
    if isinstance(planned, list | tuple):
        return isinstance(value, list | tuple) and len(value) == len(planned) and \
            all(_matches(p, v) for p, v in zip(planned, value, strict=True))
    if isinstance(planned, Mapping):
        return isinstance(value, Mapping) and set(value) == set(planned) and \
            all(_matches(p, value[k]) for k, p in planned.items())
    return False


def _glob(pattern: str, text: str) -> bool:
    """`*` as any run of characters, the rest literal, both sides normalised.

    Linear: each piece is found once, left to right (no backtracking for a model's text to
    exploit).
    """
    pieces = [normalise(p) for p in pattern.split("*")]
    subject = normalise(text)
    if len(pieces) == 1:
        return subject == pieces[0]
    first, *middle, last = pieces
    if not subject.startswith(first) or not subject.endswith(last) or \
            len(subject) < len(first) + len(last):
        return False
    at, end = len(first), len(subject) - len(last)
    for piece in middle:
        found = subject.find(piece, at, end)
        if found < 0:
            return False
        at = found + len(piece)
    return True


# ------------------------------------------------------------------ a planning turn

PLAN_TOOL = "handrail/plan"
"""The one tool a planning turn offers: its arguments are the plan."""

MAX_PLAN_ARGUMENT_CHARS = 64 * 1024
"""The JSON text of a model's plan at most."""

PLANNER = """\
Before doing anything, commit to a plan. You have seen no tool output yet, and you will see
none while planning: plan from the request alone. Call the tool `{name}` once, with `steps`:
one entry for each call you will make that changes the world (sends, writes, creates,
books, pays, deletes, shares), naming the tool (`server/name`) and, in `arguments`, the
values the user's request fixes for that call. Write `*` for any part you will only learn
from tools (`"title": "Dinner at *"`), and leave out an argument the request does not fix.
Calls that only read need no step. If the task changes nothing, call it with no steps.
While you carry the plan out, a call that changes the world outside it is held for a person.

The tools:
{tools}"""
"""The planning turn's instructions (after the agent's own)."""

PLAN_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"steps": {"type": "array", "maxItems": MAX_STEPS, "items": {
        "type": "object",
        "properties": {"tool": {"type": "string", "description": "server/name"},
                       "arguments": {"type": "object",
                                     "description": "argument -> the value the request "
                                                    "fixes ('*' for a part tools tell)"}},
        "required": ["tool"]}}},
    "required": ["steps"],
}
"""The plan tool's arguments."""


def planning_system(instructions: str | None, specs: Sequence[Any]) -> str:
    """The planning turn's system text: the instructions, then the tools.

    The task follows it as the user's message (no tool output); the loop builds the two.
    """
    lines = []
    for spec in specs:
        description = " ".join(str(spec.description).split())
        if len(description) > 200:
            description = description[:200] + "..."
        lines.append(f"- {spec.id}{'' if spec.mutates else ' (changes nothing)'}: "
                     f"{description}")
    planner = PLANNER.format(name=plan_spec().id.model_name, tools="\n".join(lines) or "(none)")
    return f"{instructions}\n\n{planner}" if instructions else planner


def plan_spec() -> Any:
    """The `ToolSpec` of the planning turn's one tool."""
    from handrail.tools._names import ToolId
    from handrail.tools._spec import ToolSpec

    return ToolSpec(ToolId.of(PLAN_TOOL), "Commit to the world-changing calls this task will make.",
                    PLAN_SCHEMA, mutates=False)


def plan_from_response(message: Any, specs: Sequence[Any]) -> Plan:
    """The plan a planning turn's assistant message commits to.

    A step naming a tool by its model-facing name is read as that tool's id.

    Raises:
        ModelResponseError: the model did not call the plan tool exactly once with a plan
            (what it did instead is said).
    """
    import json

    from handrail.errors import ModelResponseError

    name = plan_spec().id.model_name
    calls = [c for c in message.tool_calls if c.name == name]
    if len(calls) != 1:
        raise ModelResponseError(
            f"the planning turn must call {name} once with the plan; the model made "
            f"{len(message.tool_calls)} tool call(s) and {len(calls)} to {name} "
            f"(its text: {message.text[:200]!r})")
    text = calls[0].arguments
    if len(text) > MAX_PLAN_ARGUMENT_CHARS:
        raise ModelResponseError(f"the model's plan is {len(text)} characters, at most "
                                 f"{MAX_PLAN_ARGUMENT_CHARS}")
    try:
        data = json.loads(text or "{}")
    except (ValueError, RecursionError) as exc:
        raise ModelResponseError(f"the model's plan is not JSON: {exc}") from None
    steps = data.get("steps") if isinstance(data, dict) else None
    if not isinstance(steps, list):
        raise ModelResponseError("the model's plan has no list of steps: "
                                 f"{text[:200]!r}")
    by_model_name = {spec.id.model_name: str(spec.id) for spec in specs}
    try:
        return Plan(tuple(
            Step(by_model_name.get(str(s.get("tool")), str(s.get("tool"))),
                 s.get("arguments") or {})
            if isinstance(s, dict) else s for s in steps))
    except UserError as exc:
        raise ModelResponseError(f"the model's plan is not a valid plan: {exc}") from None
