"""ToolName, ToolId and the exact, reversible model-facing name."""

import pickle
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

import handrail as hr
from handrail.tools import DEFAULT_SERVER

NAME_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"
names = st.text(alphabet=NAME_ALPHABET, min_size=1, max_size=64)
# Names made to collide: few letters, many escapes and separators.
tricky = st.text(alphabet="ad-h._", min_size=1, max_size=12)
servers = st.one_of(st.just(DEFAULT_SERVER), names, tricky)
tool_ids = st.builds(hr.ToolId, servers, st.one_of(names, tricky))
PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]+")


# ----------------------------------------------------------------------------- ToolName


@pytest.mark.parametrize("good", ["a", "get_weather", "A.b-c_9", "x" * 64, "-", ".", "local"])
def test_tool_name_accepts_the_alphabet(good: str) -> None:
    assert hr.ToolName(good) == good
    assert isinstance(hr.ToolName(good), str)


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "x" * 65,
        "get weather",
        " get_weather",
        "get_weather ",
        "get_weather\n",
        "a/b",
        "gеt_weather",  # Cyrillic е
        "ｇet",  # fullwidth g
        "café",
        "a\u200bb",  # zero-width space
        "tab\there",
    ],
)
def test_tool_name_refuses_everything_else(bad: str) -> None:
    with pytest.raises(hr.UserError, match="invalid tool name"):
        hr.ToolName(bad)


def test_tool_name_refuses_non_strings() -> None:
    with pytest.raises(hr.UserError, match="must be a string"):
        hr.ToolName(5)  # type: ignore[arg-type]


def test_tool_name_as_a_pydantic_field_is_fully_anchored() -> None:
    class M(BaseModel):
        name: hr.ToolName

    assert isinstance(M(name="ok.name").name, hr.ToolName)
    for bad in ["ok name", "ok\n", "ok/x", "", "x" * 65, "ok\u0430"]:
        with pytest.raises(ValidationError):
            M(name=bad)


# ----------------------------------------------------------------------------- ToolId


def test_tool_id_is_written_server_slash_name() -> None:
    tid = hr.ToolId("ledger", "transfer")
    assert str(tid) == "ledger/transfer"
    assert (tid.server, tid.name) == ("ledger", "transfer")
    assert repr(tid) == "ToolId('ledger', 'transfer')"


def test_tool_id_parse_and_of() -> None:
    assert hr.ToolId.parse("ledger/transfer") == hr.ToolId("ledger", "transfer")
    assert hr.ToolId.parse("get_weather") == hr.ToolId("local", "get_weather")
    tid = hr.ToolId("a", "b")
    assert hr.ToolId.of(tid) is tid
    assert hr.ToolId.of("a/b") == tid


@pytest.mark.parametrize("bad", ["a/b/c", "/b", "a/", "a b/c", "a/b c", "", "ａ/b"])
def test_tool_id_parse_refuses_malformed(bad: str) -> None:
    with pytest.raises(hr.UserError):
        hr.ToolId.parse(bad)


def test_tool_id_parse_refuses_non_strings() -> None:
    with pytest.raises(hr.UserError, match="server/name"):
        hr.ToolId.parse(3)  # type: ignore[arg-type]


def test_tool_id_is_immutable_hashable_ordered_and_picklable() -> None:
    a, b = hr.ToolId("a", "x"), hr.ToolId("b", "x")
    with pytest.raises(AttributeError):
        a.name = "y"  # type: ignore[misc]
    assert {a: 1}[hr.ToolId("a", "x")] == 1
    assert a < b and a <= b and b > a and b >= a and not a > b
    assert sorted([b, a]) == [a, b]
    assert a != "a/x"
    with pytest.raises(TypeError):
        _ = a < "b/x"  # type: ignore[operator]
    assert pickle.loads(pickle.dumps(a)) == a
    assert pickle.loads(pickle.dumps(a)).model_name == a.model_name


# ------------------------------------------------------------------------ model names


@pytest.mark.parametrize(
    ("server", "name", "model_name"),
    [
        ("local", "get_weather", "get_weather"),
        ("local", "GetWeather2", "GetWeather2"),
        ("local", "a.b", "a-db"),
        ("local", "a-b", "a-hb"),
        ("ledger", "transfer", "ledger--transfer"),
        ("my.srv", "do-it", "my-dsrv--do-hit"),
        ("ledger", "-", "ledger---h"),
    ],
)
def test_model_name_encoding(server: str, name: str, model_name: str) -> None:
    tid = hr.ToolId(server, name)
    assert tid.model_name == model_name
    assert hr.ToolId.from_model_name(model_name) == tid


@given(tool_ids)
def test_model_names_fit_every_provider_alphabet(tid: hr.ToolId) -> None:
    assert PROVIDER_NAME.fullmatch(tid.model_name)


@given(tool_ids, tool_ids)
def test_two_ids_never_share_a_model_name(a: hr.ToolId, b: hr.ToolId) -> None:
    if a != b:
        assert a.model_name != b.model_name
    else:
        assert a.model_name == b.model_name


@given(tool_ids)
def test_from_model_name_inverts_model_name_exactly(tid: hr.ToolId) -> None:
    assert hr.ToolId.from_model_name(tid.model_name) == tid


@given(st.text(max_size=40))
def test_from_model_name_only_accepts_canonical_encodings(text: str) -> None:
    tid = hr.ToolId.from_model_name(text)
    if tid is not None:
        assert tid.model_name == text


@given(st.text(alphabet="ad-h._Lloca", max_size=16))
def test_from_model_name_on_escape_heavy_text(text: str) -> None:
    tid = hr.ToolId.from_model_name(text)
    assert tid is None or tid.model_name == text


@given(tool_ids)
def test_perturbed_model_names_never_resolve_to_the_same_id(tid: hr.ToolId) -> None:
    encoded = tid.model_name
    variants = {
        encoded.upper(),
        encoded.lower(),
        encoded.swapcase(),
        f" {encoded}",
        f"{encoded} ",
        f"{encoded}\n",
        encoded.replace("a", "\u0430"),  # Cyrillic look-alike
        encoded.replace("-", "\u2010"),  # Unicode hyphen
    } - {encoded}
    for variant in variants:
        back = hr.ToolId.from_model_name(variant)
        assert back != tid
        assert back is None or back.model_name == variant


@pytest.mark.parametrize(
    "text",
    [
        "local--x",  # `x` on the default server is spelled `x`
        "Get_Weather " ,
        "GET_WEATHER\t",
        "",
        "-",
        "a-",
        "a-x",  # unknown escape
        "a--",  # empty name
        "--a",  # empty server
        "a--b--c",  # two separators
        "a---",  # dangling escape
        "gеt_weather",  # Cyrillic е
        "get.weather",  # a raw dot is never produced
        "a-hb-",
    ],
)
def test_from_model_name_refuses_non_encodings(text: str) -> None:
    assert hr.ToolId.from_model_name(text) is None


def test_from_model_name_is_case_exact() -> None:
    assert hr.ToolId.from_model_name("get_weather") == hr.ToolId("local", "get_weather")
    assert hr.ToolId.from_model_name("Get_Weather") == hr.ToolId("local", "Get_Weather")
    assert hr.ToolId.from_model_name("Ledger--transfer") == hr.ToolId("Ledger", "transfer")
    assert hr.ToolId.from_model_name("Ledger--transfer") != hr.ToolId("ledger", "transfer")


def test_from_model_name_refuses_non_strings() -> None:
    assert hr.ToolId.from_model_name(None) is None  # type: ignore[arg-type]
