"""The exception tree: every ToolError says whether the world changed."""

import inspect
import pickle
import re

import pytest

import handrail as hr
from handrail import errors


def all_subclasses(cls: type) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(all_subclasses(sub))
    return found


def tool_error_classes() -> list[type[errors.ToolError]]:
    return [c for c in all_subclasses(errors.ToolError) if c.__module__ == errors.__name__]


def handrail_error_classes() -> list[type[errors.HandrailError]]:
    return [c for c in all_subclasses(errors.HandrailError) if c.__module__ == errors.__name__]


def tree() -> dict[str, str | None]:
    """Class name -> disposition label, as drawn in the module docstring."""
    drawn: dict[str, str | None] = {}
    assert errors.__doc__ is not None
    for line in errors.__doc__.splitlines():
        match = re.match(r"^[│├└─\s]*([A-Z]\w+)(?:\s+(NOT_SENT|IN_DOUBT|LANDED)\b)?", line)
        if match and not line.startswith(("Every", "Retrying")):
            drawn[match.group(1)] = match.group(2)
    return drawn


def test_there_are_tool_errors_to_check() -> None:
    assert len(tool_error_classes()) >= 11


@pytest.mark.parametrize("cls", tool_error_classes(), ids=lambda c: c.__name__)
def test_every_tool_error_declares_a_disposition(cls: type[errors.ToolError]) -> None:
    assert isinstance(getattr(cls, "default_disposition", None), hr.Disposition), (
        f"{cls.__name__} must declare default_disposition"
    )


@pytest.mark.parametrize("cls", tool_error_classes(), ids=lambda c: c.__name__)
def test_the_drawn_tree_labels_each_tool_error_with_its_disposition(
    cls: type[errors.ToolError],
) -> None:
    assert tree()[cls.__name__] == cls.default_disposition.name


def test_the_drawn_tree_matches_the_classes() -> None:
    drawn = tree()
    classes = {c.__name__ for c in handrail_error_classes()} | {"HandrailError"}
    assert set(drawn) == classes


@pytest.mark.parametrize("cls", handrail_error_classes(), ids=lambda c: c.__name__)
def test_every_error_has_a_docstring_and_is_in_all(cls: type) -> None:
    assert cls.__doc__ and cls.__doc__.strip()
    assert cls.__name__ in errors.__all__


def test_disposition_instances() -> None:
    assert errors.UnknownTool("x").disposition is hr.Disposition.NOT_SENT
    assert errors.ToolTimeout("x").disposition is hr.Disposition.IN_DOUBT
    assert errors.ToolFailed("x").disposition is hr.Disposition.LANDED
    assert errors.CallCancelled("r").disposition is hr.Disposition.IN_DOUBT
    cancelled = errors.CallCancelled("r", disposition=hr.Disposition.NOT_SENT)
    assert cancelled.disposition is hr.Disposition.NOT_SENT
    assert errors.TransportError("x", disposition=hr.Disposition.NOT_SENT).disposition is (
        hr.Disposition.NOT_SENT
    )


def test_a_tool_error_without_a_disposition_is_refused() -> None:
    with pytest.raises(TypeError, match="default_disposition"):
        errors.ToolError("which one?")
    assert errors.ToolError("x", disposition=hr.Disposition.LANDED).disposition is (
        hr.Disposition.LANDED
    )
    with pytest.raises(TypeError, match=r"hr\.Disposition"):
        errors.ToolFailed("x", disposition="landed")  # type: ignore[arg-type]


def test_messages_and_fields() -> None:
    issue = errors.Issue(path="$.a", message="bad")
    invalid = errors.InvalidArguments("t/x", [issue])
    assert invalid.tool == "t/x" and invalid.issues == [issue]
    assert "- $.a: bad" in str(invalid)
    output = errors.InvalidOutput("t/x", [issue])
    assert "t/x" in str(output) and "$.a: bad" in str(output)
    denied = errors.PolicyDenied(rule="r1", layer="app")
    assert str(denied) == errors.PolicyDenied.MODEL_MESSAGE and "r1" not in str(denied)
    assert errors.ApprovalDenied("too much").reason == "too much"
    assert errors.InteractionDeclined("no").reason == "no"
    drift = errors.ManifestDrift(["a", "b"])
    assert drift.problems == ["a", "b"] and "2 problems" in str(drift)
    assert "(1 problem)" in str(errors.ManifestDrift(["a"]))
    model = errors.ModelAuthError("401", status=401, body={"e": 1})
    assert (model.status, model.body) == (401, {"e": 1})


def sample(cls: type[errors.HandrailError]) -> errors.HandrailError:
    """An instance of cls, built with whatever its constructor needs."""
    try:
        params = inspect.signature(cls).parameters
    except ValueError:  # no __init__ of its own: Exception's (message)
        return cls("x")
    positional = [p for p in params.values()
                  if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                         p.POSITIONAL_OR_KEYWORD)]
    values = {"issues": [errors.Issue(path="$", message="m")], "problems": ["p"]}
    return cls(*[values.get(p.name, "x") for p in positional])


@pytest.mark.parametrize("cls", handrail_error_classes(), ids=lambda c: c.__name__)
def test_every_error_survives_pickling(cls: type[errors.HandrailError]) -> None:
    if cls is errors.ToolError:
        error: errors.HandrailError = cls("x", disposition=hr.Disposition.LANDED)
    else:
        error = sample(cls)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is cls
    assert str(back) == str(error)
    assert back.__dict__ == error.__dict__
