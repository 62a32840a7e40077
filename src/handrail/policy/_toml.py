"""The policy file format: a strict dict form, and TOML text around it.

```toml
[policy]
extends = "default"            # optional: start from hr.Policy.default()'s layers and defaults
taint = "deny"                 # optional: a tainted call is denied, not asked (docs/taint.md)

[policy.defaults]              # optional; missing keys take the built-in defaults
read = "allow"
write = "ask"
exec = "ask"
net = "deny"
call = "ask"
call_read_only = "allow"       # CALL of a tool declaring mutates=False

[[policy.layers]]              # top first
name = "app"
deny = ["write:src/secrets/**"]
ask = ["call:ledger/transfer/*"]
allow = ["write:src/**", "exec:git status", "net:api.example.com:443"]
```

An `ask` entry may be a table with options (`AskTerms`, docs/notify.md):
`{ rule = "call:ledger/transfer/*", approvals = 2, expires = "30m", escalate = "10m" }`.

A rule is `"act:pattern"` (split at the first `:`, so `net:host:443` works). Unknown keys,
acts and effects are refused with the key path (`policy.layers[1].alow`) and, for TOML text,
the line. `to_dict` writes the canonical form: all six defaults, every layer with its `deny`,
`ask` and `allow` lists (empty ones left out), no `extends`.
"""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from handrail.errors import PolicyError
from handrail.policy._limits import Limit
from handrail.policy._policy import DEFAULT_KEYS, Effect, Layer, Policy, Rule
from handrail.policy._terms import AskTerms
from handrail.policy._tomltext import MAX_NESTING, too_deep, without_bom

__all__ = ["policy_from_dict", "policy_from_toml", "policy_to_dict", "policy_to_toml"]

_TOP_KEYS = ("extends", "taint", "defaults", "layers")
_TAINT = ("ask", "deny")
_LAYER_KEYS = ("name", "deny", "ask", "allow", "limits")
_RULE_KEYS = ("rule", "when")
_ASK_TERMS = ("approvals", "expires", "default", "escalate")
_EXTENDS = ("default",)


class _Located(PolicyError):
    """A PolicyError that knows its key path (so TOML parsing can add the line)."""

    def __init__(self, source: str, path: list[str | int], message: str) -> None:
        self.source = source
        self.path = list(path)
        self.detail = message
        super().__init__(f"{source}: {_render(path)}: {message}")


def _render(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The canonical dict form of `policy`."""
    layers: list[dict[str, Any]] = []
    for layer in policy.layers:
        entry: dict[str, Any] = {"name": layer.name}
        for effect in (Effect.DENY, Effect.ASK, Effect.ALLOW):
            # A rule with value conditions or an ask with terms (approvals, a deadline) is a
            # table; every other rule stays the string it always was (and so does every
            # canonical form that hashes it).
            specs: list[Any] = [
                r.spec if not r.when and r.terms is None else
                {"rule": r.spec, **({"when": [str(c) for c in r.when]} if r.when else {}),
                 **(r.terms.to_dict() if r.terms is not None else {})}
                                for r in layer.rules if r.effect is effect]
            if specs:
                entry[effect.value] = specs
        if layer.limits:
            # Only when present: every policy without limits keeps its form and digest.
            entry["limits"] = [limit.to_dict() for limit in layer.limits]
        layers.append(entry)
    out: dict[str, Any] = {
        "defaults": {k: policy.defaults[k].value for k in DEFAULT_KEYS},
        "layers": layers,
    }
    if policy.taint != "ask":
        # Only when it differs from the default: every existing canonical form (and the
        # manifest digests that hash it) stays as it was.
        out["taint"] = policy.taint
    return out


def _unknown(source: str, path: list[str | int], data: Mapping[str, Any],
             known: tuple[str, ...]) -> None:
    for key in data:
        if key not in known:
            raise _Located(
                source, [*path, str(key)],
                f"unknown key {key!r} (expected one of: {', '.join(known)})",
            )


def policy_from_dict(data: Mapping[str, Any], *, source: str = "<policy>") -> Policy:
    """Build a policy from its dict form, refusing anything unknown.

    Raises:
        PolicyError: the message names `source` and the key path of the problem.
    """
    path: list[str | int] = ["policy"]
    if not isinstance(data, Mapping):
        raise _Located(source, path, f"expected a table, got {type(data).__name__}")
    _unknown(source, path, data, _TOP_KEYS)
    base: Policy | None = None
    if "extends" in data:
        extends = data["extends"]
        if extends not in _EXTENDS:
            raise _Located(source, [*path, "extends"],
                           f"unknown base {extends!r} (expected: {', '.join(_EXTENDS)})")
        base = Policy.default()
    taint = data.get("taint", "ask")
    if taint not in _TAINT:
        raise _Located(source, [*path, "taint"],
                       f"unknown taint effect {taint!r} (expected: {', '.join(_TAINT)})")
    defaults: dict[str, Effect] = {}
    raw_defaults = data.get("defaults", {})
    if not isinstance(raw_defaults, Mapping):
        raise _Located(source, [*path, "defaults"], "expected a table of act = effect")
    _unknown(source, [*path, "defaults"], raw_defaults, DEFAULT_KEYS)
    for key, value in raw_defaults.items():
        try:
            defaults[key] = Effect.parse(value)
        except PolicyError as exc:
            raise _Located(source, [*path, "defaults", key], str(exc)) from None
    if base is not None:
        inherited = dict(base.defaults)
        if "call" in defaults and "call_read_only" not in defaults:
            inherited["call_read_only"] = defaults["call"]
        defaults = {**inherited, **defaults}
    raw_layers = data.get("layers", [])
    if not isinstance(raw_layers, list):
        raise _Located(source, [*path, "layers"], "expected an array of tables ([[layers]])")
    layers: list[Layer] = list(base.layers) if base is not None else []
    for i, raw in enumerate(raw_layers):
        lpath: list[str | int] = [*path, "layers", i]
        if not isinstance(raw, Mapping):
            raise _Located(source, lpath, "expected a table with name and rules")
        _unknown(source, lpath, raw, _LAYER_KEYS)
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise _Located(source, [*lpath, "name"], "every layer needs a non-empty name")
        rules: list[Rule] = []
        for effect in (Effect.DENY, Effect.ASK, Effect.ALLOW):
            specs = raw.get(effect.value, [])
            if not isinstance(specs, list):
                raise _Located(source, [*lpath, effect.value],
                               "expected an array of 'act:pattern' strings")
            for j, spec in enumerate(specs):
                try:
                    if isinstance(spec, Mapping):
                        # `{rule = "call:bank/transfer", when = "amount > 500"}`, and for an
                        # ask its terms: `approvals = 2, expires = "30m", ...`
                        keys = _RULE_KEYS + (_ASK_TERMS if effect is Effect.ASK else ())
                        _unknown(source, [*lpath, effect.value, j], spec, keys)
                        if "rule" not in spec:
                            raise PolicyError(
                                "an ask with options is a table with rule = 'act:pattern' "
                                "and any of when, approvals, expires, default, escalate"
                                if effect is Effect.ASK else
                                "a rule with a condition is {rule = \"act:pattern\", "
                                "when = \"argument op value\"}")
                        rules.append(_rule_table(spec, effect))
                    else:
                        rules.append(Rule.parse(spec, effect))
                except _Located:
                    raise
                except PolicyError as exc:
                    raise _Located(source, [*lpath, effect.value, j], str(exc)) from None
        raw_limits = raw.get("limits", [])
        if not isinstance(raw_limits, list):
            raise _Located(source, [*lpath, "limits"], 'expected an array of {rule = '
                           '"act:pattern", max = N, per = "1d"} tables')
        limits: list[Limit] = []
        for j, spec in enumerate(raw_limits):
            try:
                limits.append(Limit.from_dict(spec))
            except PolicyError as exc:
                raise _Located(source, [*lpath, "limits", j], str(exc)) from None
        try:
            layers.append(Layer(name, tuple(rules), limits=tuple(limits)))
        except PolicyError as exc:
            raise _Located(source, [*lpath, "name"], str(exc)) from None
    return Policy(tuple(layers), defaults, taint=taint)


def _rule_table(spec: Mapping[str, Any], effect: Effect) -> Rule:
    """`{rule = "call:x/*", when = "...", approvals = 2, expires = "30m", ...}` as a Rule."""
    options = {k: v for k, v in spec.items() if k not in _RULE_KEYS}
    rule = Rule.parse(spec["rule"], effect)
    return Rule(rule.act, rule.pattern, effect, AskTerms.from_dict(options) if options else None,
                when=spec.get("when", ()))


def _toml_str(text: str) -> str:
    # JSON string escapes are a subset of TOML's; DEL is the one control JSON leaves raw.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value: Any) -> str:
    """A string, a number, or an inline table of them (lists of strings inside)."""
    if isinstance(value, str):
        return _toml_str(value)
    if isinstance(value, bool):  # pragma: no cover - the canonical form has none
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"


def policy_to_toml(policy: Policy) -> str:
    """`policy` as a TOML document holding one `[policy]` table."""
    data = policy_to_dict(policy)
    lines = [] if "taint" not in data else ["[policy]", f"taint = {_toml_str(data['taint'])}", ""]
    lines += ["[policy.defaults]"]
    lines += [f"{k} = {_toml_str(v)}" for k, v in data["defaults"].items()]
    for layer in data["layers"]:
        lines += ["", "[[policy.layers]]", f"name = {_toml_str(layer['name'])}"]
        for effect in ("deny", "ask", "allow"):
            if effect in layer:
                lines.append(f"{effect} = [")
                lines += [f"    {_toml_value(s)}," for s in layer[effect]]
                lines.append("]")
        if "limits" in layer:
            lines.append("limits = [")
            lines += [f"    {_toml_value(s)}," for s in layer["limits"]]
            lines.append("]")
    return "\n".join(lines) + "\n"


def policy_from_toml(text: str, *, source: str = "<policy>") -> Policy:
    """Parse TOML text holding a `[policy]` table (or the policy's keys at the top level).

    Raises:
        PolicyError: invalid TOML, or an invalid policy; the message names the line.
    """
    text = without_bom(text)
    line = too_deep(text)
    if line is not None:
        raise PolicyError(f"{source}:{line}: arrays or inline tables nest more than "
                          f"{MAX_NESTING} levels deep; a policy needs only a few")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{source}: invalid TOML: {exc}") from None
    except RecursionError:  # pragma: no cover - too_deep refuses such text first
        raise PolicyError(f"{source}: nested too deeply to parse") from None
    wrapped = set(doc) == {"policy"} and isinstance(doc["policy"], Mapping)
    data = doc["policy"] if wrapped else doc
    try:
        return policy_from_dict(data, source=source)
    except _Located as exc:
        line = _locate(text, exc.path[1:], wrapped=wrapped)
        if line is None:
            raise
        raise PolicyError(
            f"{source}:{line}: {_render(exc.path)}: {exc.detail}"
        ) from None


def _locate(text: str, path: list[str | int], *, wrapped: bool) -> int | None:
    """Best-effort line number (1-based) of the key path in TOML text; None if not found.

    tomllib keeps no positions, so this scans: each `layers[i]` step finds the i-th
    `[[layers]]` header, each key the next `key =` line (or `[...key]` header).
    """
    lines = text.splitlines()
    prefix = r"(?:policy\s*\.\s*)?" if wrapped else ""
    at = 0
    found: int | None = None
    k = 0
    while k < len(path):
        part = path[k]
        if part == "layers" and k + 1 < len(path) and isinstance(path[k + 1], int):
            header = re.compile(rf"^\s*\[\[\s*{prefix}layers\s*\]\]")
            seen = -1
            hit = None
            for n in range(at, len(lines)):
                if header.match(lines[n]):
                    seen += 1
                    if seen == path[k + 1]:
                        hit = n
                        break
            if hit is None:
                return found
            at, found = hit, hit + 1
            k += 2
            continue
        if isinstance(part, int):
            # An array element: the n-th quoted string after the key.
            count = -1
            for n in range(at, len(lines)):
                count += len(re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'', lines[n]))
                if count >= part:
                    return n + 1
            return found
        key = re.compile(
            rf"^\s*(?:{re.escape(part)}|\"{re.escape(part)}\")\s*=|^\s*\[\s*{prefix}"
            rf"{re.escape(part)}\s*\]"
        )
        for n in range(at, len(lines)):
            if key.match(lines[n]):
                at, found = n, n + 1
                break
        else:
            return found
        k += 1
    return found
