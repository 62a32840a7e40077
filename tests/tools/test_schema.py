"""Google-style docstring parsing for tool and parameter descriptions."""

import pytest

from handrail.tools._schema import parse_docstring


def test_empty_docstrings() -> None:
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("") == ("", {})


def test_description_is_the_text_before_the_sections() -> None:
    doc = """Read a balance.

    Longer text,
    over lines.

    Args:
        account: The account.

    Returns:
        The balance.
    """
    description, params = parse_docstring(doc)
    assert description == "Read a balance.\n\nLonger text,\nover lines."
    assert params == {"account": "The account."}


def test_args_with_types_continuations_and_colons() -> None:
    doc = """Do it.

    Args:
        a (int): First, with
            a continuation line.
        b (dict[str, tuple(int)]): Nested parentheses: and a colon.
        c: The url: http://example.com/x
        d:
            Described on the next line.
        *args: Star args.
        **kwargs: Keyword args.
    """
    _, params = parse_docstring(doc)
    assert params == {
        "a": "First, with a continuation line.",
        "b": "Nested parentheses: and a colon.",
        "c": "The url: http://example.com/x",
        "d": "Described on the next line.",
        "args": "Star args.",
        "kwargs": "Keyword args.",
    }


def test_a_deeper_continuation_that_looks_like_an_arg_stays_a_continuation() -> None:
    doc = """X.

    Args:
        mode: How to run.
            note: this line is part of mode's description.
        other: Other.
    """
    _, params = parse_docstring(doc)
    assert params == {
        "mode": "How to run. note: this line is part of mode's description.",
        "other": "Other.",
    }


@pytest.mark.parametrize(
    "header", ["Args", "Arguments", "Parameters", "Params", "Keyword Args", "Attributes"]
)
def test_parameter_section_names(header: str) -> None:
    _, params = parse_docstring(f"X.\n\n{header}:\n    a: A.\n")
    assert params == {"a": "A."}


def test_other_sections_do_not_leak_into_params_or_description() -> None:
    doc = """X.

    Raises:
        ValueError: when it fails.

    Example:
        x: 1
    """
    assert parse_docstring(doc) == ("X.", {})


def test_unindented_text_after_a_section_ends_it() -> None:
    doc = """X.

    Args:
        a: A.

    More about X.
    """
    description, params = parse_docstring(doc)
    assert params == {"a": "A."}
    assert description == "X.\n\nMore about X."


def test_inline_colon_phrases_are_not_headers() -> None:
    doc = "Note: this is prose.\n\nExample: also prose."
    assert parse_docstring(doc) == (doc, {})


def test_an_indented_header_like_line_is_not_a_header() -> None:
    doc = """X.

    Args:
        a: A, see
            Returns:
        b: B.
    """
    _, params = parse_docstring(doc)
    assert params == {"a": "A, see Returns:", "b": "B."}
