"""The digest hashes the manifest's meaning: spelling never changes it, meaning always does.

A manifest is drawn as plain data, built directly (the reference digest), then written as TOML
in a randomly chosen spelling (key and table order, inline tables, dotted keys, string
flavours, number spellings, comments, blank space, CRLF) and parsed back: the digest must not
move. Every single-field change of the data must move it.
"""

from __future__ import annotations

import copy
import json
import random
import re
import tomllib
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handrail.manifest import CANONICAL_FORMAT, AgentSection, Budgets, Grant, Manifest
from handrail.manifest._locate import key_lines
from handrail.policy import Policy

Data = dict[str, Any]

# -- drawing a manifest ---------------------------------------------------------------------

_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",))


def _normal(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n").strip()


texts = st.text(_CHARS, min_size=1, max_size=40).map(_normal).filter(bool)
schema_texts = st.text(_CHARS, max_size=20)  # verbatim inside a schema: no normalising
names = st.from_regex(r"[a-z][a-z0-9_.-]{0,7}", fullmatch=True)
refs = st.tuples(names, names).map(lambda p: f"{p[0]}/{p[1]}")
prop_names = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True),
                       st.text(_CHARS, min_size=1, max_size=6))


@st.composite
def schemas(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(st.dictionaries(prop_names, st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "number", "boolean"])},
        optional={"description": schema_texts, "minimum": st.integers(-5, 5),
                  "enum": st.lists(st.integers(0, 9), min_size=1, max_size=3, unique=True)},
    ), max_size=3))
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if props and draw(st.booleans()):
        schema["required"] = draw(st.lists(st.sampled_from(sorted(props)), min_size=1,
                                           unique=True))
    if draw(st.booleans()):
        schema["additionalProperties"] = False
    return schema


grants = st.fixed_dictionaries(
    {"ref": refs},
    optional={"mutates": st.booleans(), "description": texts, "idempotent": st.booleans(),
              "arguments": schemas()},
)

_RULES = ["read:src/**", "write:src/secrets/**", "exec:git status", "net:api.example.com:443",
          "call:ledger/transfer/*", "read:.env", "write:**/*.py"]
_EFFECTS = ["allow", "ask", "deny"]
_DEFAULT_KEYS = ("read", "write", "exec", "net", "call", "call_read_only")
rule_lists = st.lists(st.sampled_from(_RULES), max_size=3, unique=True)
policies = st.fixed_dictionaries({}, optional={
    "extends": st.just("default"),
    "defaults": st.fixed_dictionaries({}, optional={k: st.sampled_from(_EFFECTS)
                                                    for k in _DEFAULT_KEYS}),
    "layers": st.lists(
        st.fixed_dictionaries({"name": names}, optional={"deny": rule_lists, "ask": rule_lists,
                                                        "allow": rule_lists}),
        max_size=3, unique_by=lambda layer: layer["name"]),
})

manifests = st.fixed_dictionaries({
    "agent": st.fixed_dictionaries({}, optional={"name": texts, "instructions": texts,
                                                 "model": texts}),
    "tools": st.lists(grants, max_size=4, unique_by=lambda g: g["ref"]),
    "budgets": st.fixed_dictionaries({}, optional={
        "max_steps": st.integers(1, 10**6),
        "max_tokens": st.integers(1, 10**9),
        "max_wall_seconds": st.one_of(st.integers(1, 10**5),
                                      st.floats(0.001, 1e5, allow_nan=False)),
    }),
}, optional={"policy": policies})


def build(data: Data) -> Manifest:
    """The reference: the manifest built from the data directly, no TOML involved."""
    return Manifest(
        agent=AgentSection(**data["agent"]),
        grants=tuple(Grant(**g) for g in data["tools"]),
        budgets=Budgets(**data["budgets"]),
        policy=Policy.from_dict(copy.deepcopy(data["policy"])) if "policy" in data else None,
    )


# -- writing it in a random spelling --------------------------------------------------------


def _basic(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


_LITERAL_OK = re.compile(r"[^'\x00-\x08\x0a-\x1f\x7f]*")


def _is_table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


class Writer:
    """Writes data as TOML, choosing every spelling at random."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd

    def choice(self, *options: Any) -> Any:
        return self.rnd.choice(options)

    def key(self, name: str) -> str:
        bare = re.fullmatch(r"[A-Za-z0-9_-]+", name) is not None
        if bare and self.rnd.random() < 0.8:
            return name
        if _LITERAL_OK.fullmatch(name) and self.rnd.random() < 0.5:
            return f"'{name}'"
        return _basic(name)

    def eq(self) -> str:
        return self.choice(" = ", "=", "  =  ", "\t= ")

    def string(self, text: str, *, multiline: bool) -> str:
        styles = ["basic"]
        if _LITERAL_OK.fullmatch(text):
            styles.append("literal")
        if multiline:
            styles += ["ml_basic", "ml_basic_trim"]
            if "'" not in text and re.fullmatch(r"[^\x00-\x08\x0b-\x1f\x7f]*", text):
                styles.append("ml_literal")
        style = self.rnd.choice(styles)
        if style == "literal":
            return f"'{text}'"
        if style == "ml_literal":
            return "'''" + self.choice("", "\n") + text + "'''"
        if style == "ml_basic":
            return '"""' + self.choice("", "\n") + _basic(text)[1:-1] + '"""'
        if style == "ml_basic_trim":  # a line-ending backslash swallows the blank space after
            return '"""\\\n' + self.choice("", "  ", "\n\t ") + _basic(text)[1:-1] + '"""'
        return _basic(text)

    def text(self, text: str) -> str:
        """Model-facing text: blank space around it is not part of its meaning."""
        padded = self.choice("", " ", "\n", "  \n") + text + self.choice("", " ", "\n\n")
        return self.string(padded, multiline=True)

    def integer(self, n: int) -> str:
        style = self.choice("dec", "under", "plus", "hex", "oct", "bin") if n >= 0 else "dec"
        if style == "under" and n >= 10:
            digits = str(n)
            return digits[0] + "_" + digits[1:]
        if style == "plus":
            return f"+{n}"
        if style == "hex":
            return hex(n)
        if style == "oct":
            return f"0o{n:o}"
        if style == "bin":
            return f"0b{n:b}"
        return str(n)

    def number(self, x: float) -> str:
        if float(x).is_integer():
            n = int(x)
            return self.choice(str(n), f"{n}.0", f"{n}e0", f"{n / 10}e1" if n % 10 == 0 else
                               str(n), self.integer(n))
        return repr(float(x))

    def scalar(self, value: Any, *, text: bool = False) -> str:
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return self.integer(value)
        if isinstance(value, float):
            return self.number(value)
        if isinstance(value, str):
            return self.text(value) if text else self.string(value, multiline=False)
        if _is_table_list(value):
            return "[" + ", ".join(self.inline(v) for v in value) + "]"
        if isinstance(value, list):
            sep = self.choice(", ", ",", " , ")
            trailing = self.choice("", ",")
            return "[" + sep.join(self.scalar(v) for v in value) + (trailing if value else "") \
                + "]"
        raise AssertionError(value)

    def inline(self, value: Any) -> str:
        if isinstance(value, dict):
            items = list(value.items())
            self.rnd.shuffle(items)
            if not items:
                return "{}"
            return "{ " + ", ".join(f"{self.key(k)}{self.eq()}{self.inline(v)}"
                                    for k, v in items) + " }"
        return self.scalar(value)

    def comment(self) -> str:
        return self.choice("", "", "  # a comment", " #", "\t# [[tools]] ref = 'x'")

    def pairs(self, prefix: list[str], data: dict[str, Any], texts: frozenset[str] = frozenset(),
              tables: bool = False) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
        """Key/value lines for `data` (nested tables inline or dotted); sub-tables deferred."""
        lines: list[str] = []
        deferred: list[tuple[str, dict[str, Any]]] = []
        items = list(data.items())
        self.rnd.shuffle(items)
        for k, v in items:
            path = [*prefix, self.key(k)]
            if _is_table_list(v):
                if tables and self.rnd.random() < 0.5:
                    deferred.append((self.key(k), v))
                else:
                    lines.append(".".join(path) + self.eq() + "[" + ", ".join(
                        self.inline(e) for e in v) + "]" + self.comment())
                continue
            if isinstance(v, dict) and v:
                style = self.choice("inline", "dotted", *(["table"] if tables else []))
                if style == "dotted":
                    inner, _ = self.pairs(path, v)
                    lines += inner
                    continue
                if style == "table":
                    deferred.append((self.key(k), v))
                    continue
            value = self.scalar(v, text=k in texts) if not isinstance(v, dict) else self.inline(v)
            lines.append(".".join(path) + self.eq() + value + self.comment())
        return lines, deferred

    def table(self, header: str, data: dict[str, Any], *, array: bool = False,
              texts: frozenset[str] = frozenset()) -> list[str]:
        lines = [self.choice("", "  ") + (f"[[{header}]]" if array else f"[{header}]")
                 + self.comment()]
        body, deferred = self.pairs([], data, texts, tables=True)
        lines += body
        for k, v in deferred:
            if isinstance(v, list):
                for element in v:
                    lines += self.blank() + self.table(f"{header}.{k}", element, array=True)
            else:
                lines += self.blank() + self.table(f"{header}.{k}", v)
        return lines

    def blank(self) -> list[str]:
        return self.choice([], [""], ["", "# comment line", ""], ["   "])

    def grant(self, grant: Data) -> Data:
        # Defaults may be written out or left implicit.
        out = dict(grant)
        for name, default in (("mutates", True), ("idempotent", False)):
            if name not in out and self.rnd.random() < 0.3:
                out[name] = default
        return out

    def document(self, data: Data) -> str:
        top: list[str] = []           # key/values at the top level: before any header
        blocks: list[list[str]] = []  # tables, in any order
        tfields = frozenset({"name", "instructions", "model", "description"})
        for section in ("agent", "budgets"):
            values = data[section]
            style = self.choice("table", "inline", "dotted", *(["omit"] if not values else []))
            if style == "table":
                blocks.append(self.table(section, values, texts=tfields))
            elif style == "inline":
                top.append(f"{section}{self.eq()}{self.inline_text(values, tfields)}")
            elif style == "dotted" and values:
                lines, _ = self.pairs([section], values, tfields)
                top += lines
        if "policy" in data:
            style = self.choice("table", "inline")
            if style == "table":
                blocks.append(self.table("policy", data["policy"]))
            else:
                top.append(f"policy{self.eq()}{self.inline(data['policy'])}")
        tools = [self.grant(g) for g in data["tools"]]
        self.rnd.shuffle(tools)
        if tools and self.rnd.random() < 0.3:
            entries = [f"  {self.inline_text(g, tfields)}," for g in tools]
            top.append(f"tools{self.eq()}[")
            top += entries
            top.append("]")
        else:
            for g in tools:
                blocks.append(self.table("tools", g, array=True, texts=tfields))
        self.rnd.shuffle(blocks)
        lines = [*self.blank(), *top]
        for block in blocks:
            lines += self.blank() + block
        newline = self.choice("\n", "\r\n")
        return newline.join(lines) + self.choice("", newline)

    def inline_text(self, data: Data, texts: frozenset[str]) -> str:
        # Inline tables are single-line in TOML 1.0: text goes in single-line strings.
        items = list(data.items())
        self.rnd.shuffle(items)
        parts = []
        for k, v in items:
            if k in texts:
                value = self.string(self.choice("", " ") + v, multiline=False)
            else:
                value = self.inline(v)
            parts.append(f"{self.key(k)}{self.eq()}{value}")
        return "{ " + ", ".join(parts) + " }" if parts else "{}"


def _paths(node: Any, prefix: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if prefix:
        yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


# -- the properties -------------------------------------------------------------------------

# 120 examples: each draws a whole manifest and its spelling (~0.1 s); 200 cost the suite
# ~15 s more. The manifest's mutants (scripts/mutants manifest) are killed at 120.
_SETTINGS = settings(max_examples=120, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(manifests, st.randoms(use_true_random=False))
def test_spelling_never_changes_the_digest(data: Data, rnd: random.Random) -> None:
    reference = build(data)
    text = Writer(rnd).document(data)
    parsed = Manifest.from_toml(text)
    # Every key of every spelling has a line for messages to cite.
    assert set(_paths(tomllib.loads(text))) <= set(key_lines(text)), text
    assert parsed.canonical() == reference.canonical(), text
    assert parsed.digest == reference.digest, text


@_SETTINGS
@given(manifests)
def test_to_toml_round_trips(data: Data) -> None:
    m = build(data)
    assert Manifest.from_toml(m.to_toml()).digest == m.digest


def _mutations(data: Data) -> list[tuple[str, Data]]:
    """Every single-field change of `data` that changes what it means."""
    out: list[tuple[str, Data]] = []

    def variant(label: str, change: Any) -> None:
        new = copy.deepcopy(data)
        change(new)
        out.append((label, new))

    def other_text(old: str | None) -> str:
        return "changed" if old != "changed" else "changed again"

    for name in ("name", "instructions", "model"):
        variant(f"agent.{name}", lambda d, n=name: d["agent"].__setitem__(
            n, other_text(d["agent"].get(n))))
        if name in data["agent"]:
            variant(f"agent.{name} removed", lambda d, n=name: d["agent"].pop(n))
            variant(f"agent.{name} edited", lambda d, n=name: d["agent"].__setitem__(
                n, d["agent"][n] + "!"))
    for i, grant in enumerate(data["tools"]):
        variant(f"tools[{i}].description", lambda d, i=i: d["tools"][i].__setitem__(
            "description", other_text(d["tools"][i].get("description"))))
        variant(f"tools[{i}].mutates", lambda d, i=i: d["tools"][i].__setitem__(
            "mutates", not d["tools"][i].get("mutates", True)))
        variant(f"tools[{i}].idempotent", lambda d, i=i: d["tools"][i].__setitem__(
            "idempotent", not d["tools"][i].get("idempotent", False)))
        # Upper case is never drawn, so the new ref cannot collide with another grant.
        variant(f"tools[{i}].ref", lambda d, i=i: d["tools"][i].__setitem__(
            "ref", d["tools"][i]["ref"] + "X"))
        variant(f"tools[{i}] removed", lambda d, i=i: d["tools"].pop(i))
        if "arguments" in grant:
            variant(f"tools[{i}].arguments removed",
                    lambda d, i=i: d["tools"][i].pop("arguments"))
            variant(f"tools[{i}].arguments.properties", lambda d, i=i: d["tools"][i][
                "arguments"]["properties"].__setitem__("new_prop", {"type": "string"}))
            variant(f"tools[{i}].arguments.minProperties", lambda d, i=i: d["tools"][i][
                "arguments"].__setitem__("minProperties", 1))
        else:
            variant(f"tools[{i}].arguments added", lambda d, i=i: d["tools"][i].__setitem__(
                "arguments", {"type": "object"}))
    variant("tools added", lambda d: d["tools"].append({"ref": "Added/Tool"}))
    for name in ("max_steps", "max_tokens", "max_wall_seconds"):
        variant(f"budgets.{name}", lambda d, n=name: d["budgets"].__setitem__(
            n, d["budgets"].get(n, 0) + 1))
        if name in data["budgets"]:
            variant(f"budgets.{name} removed", lambda d, n=name: d["budgets"].pop(n))
    if "policy" not in data:
        variant("policy added", lambda d: d.__setitem__("policy", {}))
        return out
    variant("policy removed", lambda d: d.pop("policy"))
    effective = Policy.from_dict(copy.deepcopy(data["policy"])).to_dict()
    for k in _DEFAULT_KEYS:
        other = next(e for e in _EFFECTS if e != effective["defaults"][k])
        variant(f"policy.defaults.{k}", lambda d, k=k, e=other: d["policy"].setdefault(
            "defaults", {}).__setitem__(k, e))
    for i, layer in enumerate(data["policy"].get("layers", [])):
        variant(f"policy.layers[{i}].name", lambda d, i=i: d["policy"]["layers"][i].__setitem__(
            "name", d["policy"]["layers"][i]["name"] + "X"))
        for effect in ("deny", "ask", "allow"):
            if "exec:rm -rf /" not in layer.get(effect, []):
                variant(f"policy.layers[{i}].{effect}", lambda d, i=i, e=effect: d["policy"][
                    "layers"][i].setdefault(e, []).append("exec:rm -rf /"))
    variant("policy layer added", lambda d: d["policy"].setdefault("layers", []).append(
        {"name": "Added", "deny": ["net:**"]}))
    return out


@settings(_SETTINGS, max_examples=100)
@given(manifests)
def test_every_change_of_meaning_changes_the_digest(data: Data) -> None:
    seen = {build(data).digest: "original"}
    for label, changed in _mutations(data):
        digest = build(changed).digest
        assert digest not in seen, f"{label} collides with {seen.get(digest)}"
        seen[digest] = label


def test_the_digest_and_canonical_form_are_pinned() -> None:
    # The canonical form is a published contract (docs/manifest.md): changing it changes
    # every recorded digest, so it must be a deliberate act that updates this test.
    m = Manifest.from_toml(
        '[agent]\nname = "bot"\n[[tools]]\nref = "ledger/read"\nmutates = false\n'
        'description = "Read a balance."\n[budgets]\nmax_steps = 5\nmax_wall_seconds = 60\n'
    )
    assert m.canonical() == {
        "format": CANONICAL_FORMAT,
        "agent": {"name": "bot", "instructions": None, "model": None},
        "tools": [{"ref": "ledger/read", "mutates": False, "idempotent": False,
                   "description": "Read a balance.", "arguments": None, "output": None}],
        "policy": None,
        "budgets": {"max_steps": 5, "max_tokens": None, "max_wall_seconds": 60.0},
    }
    from handrail.manifest import canonical_json

    assert canonical_json(m.canonical()) == (
        b'{"agent":{"instructions":null,"model":null,"name":"bot"},'
        b'"budgets":{"max_steps":5,"max_tokens":null,"max_wall_seconds":60},'
        b'"format":"handrail.manifest/2","policy":null,'
        b'"tools":[{"arguments":null,"description":"Read a balance.","idempotent":false,'
        b'"mutates":false,"output":null,"ref":"ledger/read"}]}'
    )
    assert m.digest == ("sha256:" + __import__("hashlib").sha256(
        canonical_json(m.canonical())).hexdigest())
    assert m.digest == "sha256:1832eadca54f88ef7eddbea3d0c7ab0f2523235cd60f6797905e7653ed703dd5"


def test_grant_order_and_source_do_not_matter_but_everything_else_does() -> None:
    a = Manifest.from_toml('[[tools]]\nref = "a/a"\n[[tools]]\nref = "b/b"\n', source="x.toml")
    b = Manifest.from_toml('[[tools]]\nref = "b/b"\n[[tools]]\nref = "a/a"\n')
    assert a == b and a.digest == b.digest and hash(a) == hash(b)
    assert [str(g.ref) for g in a.grants] == ["a/a", "b/b"]  # file order is kept for reading
    assert a != Manifest.from_toml('[[tools]]\nref = "a/a"\n')
    assert a != "not a manifest"
