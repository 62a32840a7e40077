"""`Effect`, `Rule`, `Layer`, `Verdict` and `Policy`: deciding what a call may touch.

Evaluation is deny-first across every layer, then ask, then allow, then the default for the
act; which layer a rule sits in, and how specific its pattern is, never changes the effect.
Layer order only decides which matching rule a verdict names (the first one, top to bottom).

Deny and ask rules match case-insensitively and in any Unicode normalisation form, because on
macOS and Windows `.ENV` and `.env` name the same file; allow rules match exactly. Both
directions err towards the stricter verdict.
"""

from __future__ import annotations

import enum
import os
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Literal

from handrail.errors import PolicyError, UserError
from handrail.policy._conditions import _NOT, Condition
from handrail.policy._limits import Limit
from handrail.policy._paths import (
    OutsideWorkspace,
    UncanonicalTarget,
    canonical_path,
    workspace_root,
)
from handrail.policy._patterns import Compiled, Index, Prepared, compile_pattern, fold, prepare
from handrail.policy._targets import (
    IpAddress,
    canonical_call,
    canonical_exec,
    canonical_net,
    net_addresses,
)
from handrail.policy._terms import AskTerms, parse_duration
from handrail.tools import Act, Action

__all__ = ["CONFINEMENT", "Effect", "Layer", "Policy", "Rule", "Verdict", "parse_act",
           "parse_when"]

CONFINEMENT = "confinement"
"""The `Verdict.layer` of a denial by path confinement or canonicalisation, not by a rule."""

_ACTS: dict[str, Act] = {a.value: a for a in Act}


class Effect(enum.Enum):
    """What a rule (or a default) decides. Ordered: `ALLOW < ASK < DENY`."""

    ALLOW = "allow"
    """The action proceeds."""
    ASK = "ask"
    """The approver decides."""
    DENY = "deny"
    """The action is refused; the approver never sees it."""

    @property
    def rank(self) -> int:
        """0, 1, 2 for allow, ask, deny."""
        return _RANK[self]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Effect):
            return NotImplemented
        return _RANK[self] < _RANK[other]

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Effect):
            return NotImplemented
        return _RANK[self] <= _RANK[other]

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Effect):
            return NotImplemented
        return _RANK[self] > _RANK[other]

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Effect):
            return NotImplemented
        return _RANK[self] >= _RANK[other]

    @classmethod
    def parse(cls, value: Effect | str) -> Effect:
        """`Effect.ALLOW` from `"allow"` (or an Effect).

        Raises:
            PolicyError: not one of allow, ask, deny.
        """
        if isinstance(value, Effect):
            return value
        try:
            return cls(value)
        except ValueError:
            raise PolicyError(
                f"unknown effect {value!r}: expected one of 'allow', 'ask', 'deny'"
            ) from None


_RANK = {Effect.ALLOW: 0, Effect.ASK: 1, Effect.DENY: 2}
_ASK, _DENY = Effect.ASK, Effect.DENY
_CALL = Act.CALL
# Evaluation order: deny-first, then ask, then allow.
_ORDER = (Effect.DENY, Effect.ASK, Effect.ALLOW)


def parse_act(value: Act | str) -> Act:
    """`Act.READ` from `"read"` (or an Act).

    Raises:
        PolicyError: not one of read, write, exec, net, call.
    """
    if isinstance(value, Act):
        return value
    act = _ACTS.get(value) if isinstance(value, str) else None
    if act is None:
        raise PolicyError(
            f"unknown act {value!r}: expected one of {', '.join(repr(a) for a in _ACTS)}"
        )
    return act


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: `effect` for actions of `act` whose target matches `pattern`.

    Validated on construction: `Rule(Act.WRITE, "a**")` raises `PolicyError` saying why.
    `act` and `effect` also accept their string values (`Rule("write", "src/**", "allow")`).
    A CALL rule may also look at the call's arguments: `Rule("call", "bank/transfer", "ask",
    when="amount > 500")` matches only when its conditions hold (see `Condition`).
    """

    act: Act
    """The kind of action the rule applies to."""
    pattern: str
    """The glob matched against the canonical target (see `handrail.policy` for the syntax)."""
    effect: Effect
    """What the rule decides when it matches."""
    terms: AskTerms | None = None
    """An ask's approvers, deadline, default and escalation (`AskTerms`); None: one person,
    no deadline. Only an ask rule has terms."""
    when: tuple[Condition, ...] = field(default=(), kw_only=True)
    """Value conditions on the call's validated arguments, all of which must hold (empty:
    the target alone decides). Accepts a condition's text, a `Condition`, or a sequence of
    them. A condition that cannot be decided (a missing argument...) makes a deny or ask rule
    match and an allow rule not."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "act", parse_act(self.act))
        object.__setattr__(self, "effect", Effect.parse(self.effect))
        compile_pattern(self.act, self.pattern)
        when = parse_when(self.when)
        if when and self.act is not Act.CALL:
            raise PolicyError(
                f"rule {self.effect.value} {self.act.value} {self.pattern!r}: a value condition "
                "reads a call's arguments, so it goes on a call rule (e.g. "
                "ask(Act.CALL, 'bank/transfer', when='amount > 500'))")
        object.__setattr__(self, "when", when)
        if self.terms is not None:
            if not isinstance(self.terms, AskTerms):
                raise PolicyError(f"Rule.terms takes hr.AskTerms, not {self.terms!r}")
            if self.effect is not Effect.ASK:
                raise PolicyError(f"{self.effect.value} {self.spec}: approvals, expires, "
                                  "default and escalate belong to an ask rule")
            if self.terms.plain:
                object.__setattr__(self, "terms", None)

    @property
    def spec(self) -> str:
        """The compact `act:pattern` form used in policy files."""
        return f"{self.act.value}:{self.pattern}"

    @classmethod
    def parse(cls, spec: str, effect: Effect | str) -> Rule:
        """Build a rule from its compact `act:pattern` form (`"write:src/**"`).

        Raises:
            PolicyError: not `act:pattern`, an unknown act, or a malformed pattern.
        """
        if not isinstance(spec, str):
            raise PolicyError(f"a rule is an 'act:pattern' string, not {type(spec).__name__}")
        act, sep, pattern = spec.partition(":")
        if not sep:
            raise PolicyError(
                f"rule {spec!r} has no act: write 'act:pattern', e.g. 'write:{spec}'"
            )
        return cls(parse_act(act), pattern, Effect.parse(effect))

    def describe(self) -> str:
        """`deny write '*.pem'`, `ask call 'bank/transfer' when amount > 500`: for explanations."""
        text = f"{self.effect.value} {self.act.value} {self.pattern!r}"
        if self.when:
            text += " when " + " and ".join(str(c) for c in self.when)
        return text

    def to_dict(self) -> dict[str, Any]:
        """`{"act": ..., "pattern": ..., "effect": ...}`, with `"when"` and `"terms"` if any."""
        out: dict[str, Any] = {"act": self.act.value, "pattern": self.pattern,
                               "effect": self.effect.value}
        if self.when:
            out["when"] = [str(c) for c in self.when]
        if self.terms is not None:
            out["terms"] = self.terms.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Rule:
        """The inverse of `to_dict`.

        Raises:
            PolicyError: a key is missing or unknown, or a value is malformed.
        """
        if not isinstance(data, Mapping) or not (
                {"act", "pattern", "effect"} <= set(data) <= {"act", "pattern", "effect", "when",
                                                               "terms"}):
            raise PolicyError(f"a rule is {{act, pattern, effect[, when][, terms]}}, got {data!r}")
        terms = data.get("terms")
        if terms is not None and not isinstance(terms, Mapping):
            raise PolicyError(f"a rule's terms are a table, got {terms!r}")
        return cls(data["act"], data["pattern"], data["effect"],
                   None if terms is None else AskTerms.from_dict(terms), when=data.get("when", ()))


def parse_when(when: Any) -> tuple[Condition, ...]:
    """A rule's `when` as conditions: text, a `Condition`, or a sequence of either.

    Raises:
        PolicyError: a condition that cannot be read, or more than 16 of them.
    """
    if when is None or when == ():
        return ()
    items = [when] if isinstance(when, (str, Condition)) else when
    if not isinstance(items, (list, tuple)):
        raise PolicyError(f"'when' is a condition ('amount > 500') or a list of them, not "
                          f"{type(when).__name__}")
    out = tuple(c if isinstance(c, Condition) else Condition.parse(c) for c in items)
    if len(out) > 16:
        raise PolicyError("a rule takes at most 16 value conditions")
    return out


@dataclass(frozen=True, slots=True)
class Layer:
    """A named, ordered group of rules (e.g. `secrets`, `app`, `remembered`).

    Rules are kept grouped by effect (deny, ask, allow), each group in the order given: the
    order that evaluation reads them in, and the one a policy file writes them in.
    """

    name: str
    """Shown in explanations; `confinement` is reserved for path confinement."""
    rules: tuple[Rule, ...] = ()
    """The layer's rules."""
    limits: tuple[Limit, ...] = field(default=(), kw_only=True)
    """The layer's quotas: how many matching calls may start per window (see `Limit`)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise PolicyError("a layer needs a non-empty name")
        if self.name == CONFINEMENT:
            raise PolicyError(
                f"the layer name {CONFINEMENT!r} is reserved for path confinement denials"
            )
        rules = tuple(self.rules)
        for r in rules:
            if not isinstance(r, Rule):
                raise PolicyError(f"layer {self.name!r}: {r!r} is not an hr.Rule")
        object.__setattr__(self, "rules", tuple(sorted(rules, key=lambda r: -r.effect.rank)))
        limits = tuple(self.limits)
        for limit in limits:
            if not isinstance(limit, Limit):
                raise PolicyError(f"layer {self.name!r}: {limit!r} is not an hr.Limit")
        object.__setattr__(self, "limits", limits)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the policy decided about one action, and why."""

    effect: Effect
    """The decision."""
    rule: Rule | None = None
    """The rule that decided; None when the default did, or confinement denied."""
    layer: str | None = None
    """The deciding rule's layer; `"confinement"` for a confinement denial; else None."""
    target: str = ""
    """The canonical target matched (workspace-relative path, argv joined by spaces...)."""
    reason: str = ""
    """One line for the operator (never shown to the model)."""

    @classmethod
    def _make(
        cls, effect: Effect, rule: Rule | None, layer: str | None, target: str, reason: str
    ) -> Verdict:
        # The frozen __init__ pays object.__setattr__ per field; check() is hot, so it fills
        # the slots directly. Same fields, same immutability afterwards.
        v = object.__new__(cls)
        _SET_EFFECT(v, effect)
        _SET_RULE(v, rule)
        _SET_LAYER(v, layer)
        _SET_TARGET(v, target)
        _SET_REASON(v, reason)
        return v

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form for records."""
        return {
            "effect": self.effect.value,
            "rule": None if self.rule is None else self.rule.to_dict(),
            "layer": self.layer,
            "target": self.target,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        """The inverse of `to_dict`."""
        rule = data.get("rule")
        return cls(
            Effect.parse(data["effect"]),
            None if rule is None else Rule.from_dict(rule),
            data.get("layer"),
            data.get("target", ""),
            data.get("reason", ""),
        )


_SET_EFFECT = Verdict.__dict__["effect"].__set__
_SET_RULE = Verdict.__dict__["rule"].__set__
_SET_LAYER = Verdict.__dict__["layer"].__set__
_SET_TARGET = Verdict.__dict__["target"].__set__
_SET_REASON = Verdict.__dict__["reason"].__set__
_make_verdict = Verdict._make
"""`Verdict._make` bound once: the conditional rules' path builds one per check."""

DEFAULT_KEYS = ("read", "write", "exec", "net", "call", "call_read_only")
"""The keys of `Policy.defaults`: one per act, plus the CALL default for read-only tools."""

_BUILTIN_DEFAULTS: Mapping[str, Effect] = MappingProxyType({
    "read": Effect.ALLOW,
    "write": Effect.ASK,
    "exec": Effect.ASK,
    "net": Effect.DENY,
    "call": Effect.ASK,
    "call_read_only": Effect.ALLOW,
})

SECRETS = (
    ".env", ".env.*", "*.pem", "*.key", "*.p12", "*.pfx",
    "id_rsa", "id_dsa", "id_ecdsa", "id_ecdsa_sk", "id_ed25519", "id_ed25519_sk",
    ".netrc", ".npmrc", ".pypirc", ".git-credentials",
    "**/.git/config", "**/.aws/credentials", "**/.docker/config.json", "**/.kube/config",
)
"""The paths the `secrets` layer of `Policy.default()` denies to READ and WRITE (at any depth:
a nested repository's `.git/config` holds credentials as often as the top one's): private
keys and certificate bundles, SSH keys, and the credential files of git, npm, PyPI, AWS,
Docker and Kubernetes."""


def _complete_defaults(given: Mapping[str, Effect | str] | None) -> dict[str, Effect]:
    given = dict(given or {})
    unknown = set(given) - set(DEFAULT_KEYS)
    if unknown:
        raise PolicyError(
            f"unknown default(s) {sorted(unknown)}: the keys are {', '.join(DEFAULT_KEYS)}"
        )
    out = {k: Effect.parse(v) for k, v in given.items()}
    for key in DEFAULT_KEYS:
        if key in out:
            continue
        # Setting `call` without `call_read_only` means "every call": a stricter call default
        # must not leave read-only tools on the looser built-in.
        if key == "call_read_only" and "call" in given:
            out[key] = out["call"]
        else:
            out[key] = _BUILTIN_DEFAULTS[key]
    return {k: out[k] for k in DEFAULT_KEYS}


class _EffectMatcher:
    """The compiled rules of one (act, effect)."""

    __slots__ = ("base", "effect", "folded", "folded_base", "networks", "raw_always")

    def __init__(self, effect: Effect, entries: list[tuple[int, Compiled]]) -> None:
        self.effect = effect
        # NET CIDR rules are matched by address, not as globs: a short list, tried in order.
        self.networks = [(i, c.network) for i, c in entries if c.network is not None]
        entries = [(i, c) for i, c in entries if c.network is None]
        full = [(i, c) for i, c in entries if not c.basename]
        base = [(i, c) for i, c in entries if c.basename]
        # Allow matches exactly; deny and ask also match case-folded (see the module docstring),
        # and additionally exactly when folding cannot over-approximate: non-ASCII targets
        # (folding can change lengths) and negated classes (folding can turn a mismatch into
        # a match).
        strict = effect is not Effect.ALLOW
        self.folded: tuple[Index | None, Index | None] | None = None
        self.raw_always = strict and any(c.has_negated_class for _, c in entries)
        if strict:
            self.folded = (
                Index(full, folded=True, segmented=True) if full else None,
                Index(base, folded=True, segmented=False) if base else None,
            )
        self.base: tuple[Index | None, Index | None] = (
            Index(full, folded=False, segmented=True) if full else None,
            Index(base, folded=False, segmented=False) if base else None,
        )

    def first(
        self,
        raw: tuple[Sequence[Prepared], Sequence[Prepared]],
        folded: tuple[Sequence[Prepared], Sequence[Prepared]] | None,
        ascii_only: bool,
        addresses: Sequence[IpAddress] = (),
    ) -> int | None:
        best: int | None = None
        if addresses and self.networks:
            for rid, network in self.networks:
                if any(ip.version == network.version and ip in network for ip in addresses):
                    best = rid
                    break
        if folded is not None and self.folded is not None:
            for index, cands in zip(self.folded, folded, strict=True):
                if index is not None and cands:
                    hit = index.first(cands)
                    if hit is not None and (best is None or hit < best):
                        best = hit
            if ascii_only and not self.raw_always:
                return best
        for index, cands in zip(self.base, raw, strict=True):
            if index is not None and cands:
                hit = index.first(cands)
                if hit is not None and (best is None or hit < best):
                    best = hit
        return best


def _variants(cands: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(raw spellings, folded spellings) of candidates holding non-ASCII text."""
    raw: dict[str, None] = {}
    for c in cands:
        raw[c] = None
        raw[unicodedata.normalize("NFC", c)] = None
        raw[unicodedata.normalize("NFD", c)] = None
    folded: dict[str, None] = {}
    for c in raw:
        f = fold(c)
        folded[f] = None
        folded[unicodedata.normalize("NFC", f)] = None
    return tuple(raw), tuple(folded)


def _shown(target: object) -> str:
    """A printable, JSON-safe rendering of a target that failed canonicalisation."""
    text = " ".join(target) if isinstance(target, tuple) else str(target)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)


@dataclass(frozen=True, eq=False)
class Policy:
    """Ordered, named layers of rules plus a default effect per act. Immutable.

    Build one from `Policy.default()` (or `Policy()`, which has the built-in defaults and no
    layers) with `.layer(name).allow(act, pattern).ask(...).deny(...)`; each call returns a
    new Policy. Load and save it as TOML (`Policy.load`, `policy.save`).

    ```python
    policy = (hr.Policy.default()
              .layer("app").allow(hr.Act.WRITE, "src/**").deny(hr.Act.WRITE, "src/secrets/**"))
    policy.check(hr.Action(hr.Act.WRITE, "src/app.py"), workspace=root).effect  # Effect.ALLOW
    ```
    """

    layers: tuple[Layer, ...] = ()
    """The layers, top first."""
    defaults: Mapping[str, Effect] = field(default_factory=lambda: dict(_BUILTIN_DEFAULTS))
    """The effect when no rule matches: keys `read`, `write`, `exec`, `net`, `call`, and
    `call_read_only` (CALL for a tool declaring `mutates=False`). Missing keys take the
    built-in defaults; a missing `call_read_only` follows `call` when `call` is given."""
    taint: str = field(default="ask", kw_only=True)
    """What a call whose protected argument came from untrusted tool output gets when the
    rules allow it: `"ask"` (a person decides; the default) or `"deny"`. An ask or a deny
    stays as it is. See docs/taint.md."""
    _current: int | None = field(default=None, repr=False, kw_only=True)
    """The layer the builder methods add to (set by `.layer(name)`); not part of the value."""

    NOTICE: ClassVar[str] = "permissive policy: for tests only, never for a real agent"

    def __post_init__(self) -> None:
        layers = tuple(self.layers)
        for layer in layers:
            if not isinstance(layer, Layer):
                raise PolicyError(f"{layer!r} is not an hr.Layer")
        object.__setattr__(self, "layers", layers)
        object.__setattr__(
            self, "defaults", MappingProxyType(_complete_defaults(self.defaults))
        )
        if self.taint not in ("ask", "deny"):
            raise PolicyError(f"taint must be 'ask' or 'deny', not {self.taint!r}")
        object.__setattr__(self, "_compiled", None)

    # -- construction ------------------------------------------------------------------

    @classmethod
    def default(cls) -> Policy:
        """The recommended starting point.

        Defaults: READ allow, WRITE ask, EXEC ask, NET deny, CALL allow for a tool declaring
        `mutates=False` and ask otherwise. Layer `secrets` denies READ and WRITE of the
        paths in `SECRETS` (`.env`, `*.pem`, SSH keys, `.netrc`, `.npmrc`, `.pypirc`,
        `.aws/credentials`, `.kube/config`, ...; at any depth, in any letter case).
        """
        rules = [Rule(act, p, Effect.DENY) for act in (Act.READ, Act.WRITE) for p in SECRETS]
        return cls((Layer("secrets", tuple(rules)),), dict(_BUILTIN_DEFAULTS))

    @classmethod
    def permissive(cls) -> Policy:
        """Allow every action — FOR TESTS ONLY, never for a real agent.

        Its single layer is named after this warning so every verdict says so. Path
        confinement still applies: nothing outside the workspace is ever allowed.
        """
        rules = tuple(Rule(act, "**", Effect.ALLOW) for act in Act)
        return cls((Layer(cls.NOTICE, rules),), dict.fromkeys(DEFAULT_KEYS, Effect.ALLOW))

    def _replace(
        self, *, layers: Iterable[Layer] | None = None,
        defaults: Mapping[str, Effect] | None = None, current: int | None = None,
        taint: str | None = None,
    ) -> Policy:
        return Policy(
            tuple(self.layers if layers is None else layers),
            dict(self.defaults if defaults is None else defaults),
            taint=self.taint if taint is None else taint,
            _current=current,
        )

    def layer(self, name: str) -> Policy:
        """Select layer `name` for the rule methods, appending it (empty) if it is new."""
        for i, existing in enumerate(self.layers):
            if existing.name == name:
                return self._replace(current=i)
        return self._replace(layers=(*self.layers, Layer(name)), current=len(self.layers))

    def _add(self, act: Act | str, pattern: str, effect: Effect, when: Any = None,
             terms: AskTerms | None = None) -> Policy:
        if self._current is None:
            raise PolicyError(
                f"call .layer(name) before .{effect.value}(...): every rule belongs to a layer"
            )
        rule = Rule(parse_act(act), pattern, effect, terms, when=when)
        layers = list(self.layers)
        target = layers[self._current]
        layers[self._current] = Layer(target.name, (*target.rules, rule), limits=target.limits)
        return self._replace(layers=layers, current=self._current)

    def allow(self, act: Act | str, pattern: str, *,
              when: str | Condition | Sequence[str | Condition] | None = None) -> Policy:
        """Add `allow act pattern [when ...]` to the selected layer (`when`: see `Rule`)."""
        return self._add(act, pattern, Effect.ALLOW, when)

    def ask(self, act: Act | str, pattern: str, *,
            when: str | Condition | Sequence[str | Condition] | None = None,
            approvals: int = 1, expires: float | str | None = None,
            default: Literal["deny", "approve"] = "deny",
            escalate: float | str | None = None) -> Policy:
        """Add `ask act pattern [when ...]` to the selected layer.

        Args:
            act: The act the rule applies to.
            pattern: The glob matched against the canonical target.
            when: Value conditions on the call's arguments (see `Rule`):
                `policy.layer("app").ask(Act.CALL, "bank/transfer", when="amount > 500")`
                asks for a transfer of more than 500 only.
            approvals: Distinct people who must approve (four-eyes: 2); any deny ends it.
            expires: After this long undecided (`"30m"`, or seconds), `default` is recorded
                by "expiry" (docs/notify.md).
            default: What expiry records: `"deny"` (reason "expired after 30m") or
                `"approve"`.
            escalate: After this long undecided, a second notification goes out (before
                `expires`).
        """
        terms = AskTerms(
            approvals=approvals, default=default,
            expires=None if expires is None else parse_duration(expires, what="expires"),
            escalate=None if escalate is None else parse_duration(escalate, what="escalate"))
        return self._add(act, pattern, Effect.ASK, when, terms)

    def deny(self, act: Act | str, pattern: str, *,
             when: str | Condition | Sequence[str | Condition] | None = None) -> Policy:
        """Add `deny act pattern [when ...]` to the selected layer (`when`: see `Rule`)."""
        return self._add(act, pattern, Effect.DENY, when)

    def limit(self, act: Act | str, pattern: str, count: int, *, per: str,
              key: str = "global", then: Effect | str = Effect.DENY) -> Policy:
        """Add a quota to the selected layer: at most `count` matching calls start per `per`.

        `policy.layer("app").limit(Act.CALL, "mail/send", 20, per="1d", key="agent")`: each
        agent starts at most 20 `mail/send` calls a UTC day; the next one gets `then` (deny,
        or ask). `key`: `run`, `agent`, `principal` or `global`. See `Limit`.
        """
        if self._current is None:
            raise PolicyError("call .layer(name) before .limit(...): every limit belongs to a "
                              "layer")
        limit = Limit(parse_act(act), pattern, count, per=per, key=key, effect=then)
        layers = list(self.layers)
        target = layers[self._current]
        layers[self._current] = Layer(target.name, target.rules,
                                      limits=(*target.limits, limit))
        return self._replace(layers=layers, current=self._current)

    def with_defaults(self, **effects: Effect | str) -> Policy:
        """Change defaults: `policy.with_defaults(net="ask", call_read_only="ask")`."""
        unknown = set(effects) - set(DEFAULT_KEYS)
        if unknown:
            raise PolicyError(
                f"unknown default(s) {sorted(unknown)}: the keys are {', '.join(DEFAULT_KEYS)}"
            )
        merged = dict(self.defaults)
        merged.update({k: Effect.parse(v) for k, v in effects.items()})
        return self._replace(defaults=merged, current=self._current)

    def with_taint(self, effect: Literal["ask", "deny"]) -> Policy:
        """What an allowed call with a tainted protected argument gets: `ask` or `deny`."""
        return self._replace(taint=effect, current=self._current)

    def with_layer_on_top(self, name: str, rules: Iterable[Rule]) -> Policy:
        """This policy with a new first layer (e.g. a run's remembered approvals).

        An allow placed here never beats a deny anywhere else: evaluation is deny-first.
        """
        return self._replace(layers=(Layer(name, tuple(rules)), *self.layers))

    def merge(self, other: Policy) -> Policy:
        """Both policies' layers (this one's first), and the stricter default per act."""
        defaults = {k: max(self.defaults[k], other.defaults[k]) for k in DEFAULT_KEYS}
        return self._replace(layers=(*self.layers, *other.layers), defaults=defaults,
                             taint=_stricter_taint(self.taint, other.taint))

    def contain(self, child: Policy) -> Policy:
        """The policy for a descendant (a sub-agent), which never widens this one.

        This policy's layers, plus only the child's deny and ask rules, and the stricter
        default per act. No descendant ever gains an allow its root lacked.
        """
        kept = []
        for layer in child.layers:
            rules = tuple(r for r in layer.rules if r.effect is not Effect.ALLOW)
            if rules or layer.limits:  # a quota only ever takes away: the child's stay
                kept.append(Layer(layer.name, rules, limits=layer.limits))
        defaults = {k: max(self.defaults[k], child.defaults[k]) for k in DEFAULT_KEYS}
        return self._replace(layers=(*self.layers, *kept), defaults=defaults,
                             taint=_stricter_taint(self.taint, child.taint))

    # -- evaluation --------------------------------------------------------------------

    def default_for(self, act: Act, *, mutates: bool = True) -> Effect:
        """The effect for `act` when no rule matches."""
        if act is Act.CALL and not mutates:
            return self.defaults["call_read_only"]
        return self.defaults[act.value]

    def _compile(self) -> _Compiled:
        # Compiling costs ~1 ms for the default policy; every run builds its effective policy
        # anew (recorded, contained, remembered), most often equal to the last run's: equal
        # policies (same layers, rules, defaults and taint) share one compiled form.
        compiled = _COMPILED.get(self)
        if compiled is None:
            compiled = _Compiled(self)
            if len(_COMPILED) >= _COMPILED_KEPT:
                _COMPILED.clear()  # one call: safe when threads compile at the same time
            _COMPILED[self] = compiled
        object.__setattr__(self, "_compiled", compiled)
        return compiled

    def check(
        self,
        action: Action,
        *,
        workspace: str | os.PathLike[str] | None = None,
        mutates: bool = True,
        arguments: Any = None,
    ) -> Verdict:
        """Decide `action`: deny-first over every layer, then ask, then allow, then default.

        Args:
            action: what the call touches.
            workspace: the root READ/WRITE paths are confined to; None is the current
                directory.
            mutates: the calling tool's trait; used only for the CALL default.
            arguments: the call's validated arguments (as dumped to JSON), which rules with
                value conditions read; None when not known, and then such a rule decides as
                when its argument is missing (a deny or ask matches, an allow does not).

        Returns:
            The verdict. A READ/WRITE path outside the workspace, and any target that
            cannot be canonicalised, is Deny with `layer="confinement"`. A rule with value
            conditions that decided says why in `reason` (`... (amount 900 > 500)`).
        """
        compiled: _Compiled | None = self._compiled  # type: ignore[attr-defined]
        if compiled is None:
            compiled = self._compile()
        return compiled.check(action, workspace, mutates, arguments)

    explain = check
    """The same function as `check`: every verdict carries its explanation."""

    def check_canonical_path(self, act: Act, path: str) -> Verdict:
        """Decide a READ or WRITE of `path`, already canonical: skip canonicalisation.

        For a caller that walks the workspace itself without following symbolic links (the
        program sandbox expands the policy over every entry before a program starts): each
        path it meets is the canonical workspace-relative form (`a/b/.env`, no `.`, `..`,
        `//` or link), so the one realpath per check `check` pays would be wasted. Anything
        else must go through `check`.

        Raises:
            UserError: `act` is not READ or WRITE.
        """
        if act is not Act.READ and act is not Act.WRITE:
            raise UserError("check_canonical_path decides READ and WRITE only")
        compiled: _Compiled | None = self._compiled  # type: ignore[attr-defined]
        if compiled is None:
            compiled = self._compile()
        return compiled.check_canonical_path(act, path)

    def check_canonical_exec(self, shown: str, deny: Sequence[str],
                             allow: Sequence[str]) -> Verdict:
        """Decide an EXEC whose candidates are already computed: skip resolving the program.

        `shown`, `deny` and `allow` are what `canonical_exec` returns (the target a verdict
        names, the candidates deny/ask rules see, those allow rules see). For replaying a
        recorded call with the program as it was resolved then (`what_if`); a live call
        goes through `check`, which resolves the program at the moment of the check.
        """
        compiled: _Compiled | None = self._compiled  # type: ignore[attr-defined]
        if compiled is None:
            compiled = self._compile()
        return compiled._match(Act.EXEC._value_, Act.EXEC, shown, tuple(deny), (), True,
                               tuple(allow))

    def check_all(
        self,
        actions: Iterable[Action],
        *,
        workspace: str | os.PathLike[str] | None = None,
        mutates: bool = True,
        arguments: Any = None,
    ) -> Verdict:
        """The strictest verdict over `actions` (deny > ask > allow; ties: the first).

        `arguments`: the call's validated arguments, for rules with value conditions.

        Raises:
            UserError: `actions` is empty (a call always touches something).
        """
        best: Verdict | None = None
        for action in actions:
            verdict = self.check(action, workspace=workspace, mutates=mutates,
                                 arguments=arguments)
            if best is None or verdict.effect > best.effect:
                best = verdict
                if best.effect is Effect.DENY:
                    break
        if best is None:
            raise UserError("check_all needs at least one action")
        return best

    @property
    def conditional(self) -> bool:
        """Whether any rule has value conditions (a CALL's verdict then needs its arguments)."""
        return any(r.when for layer in self.layers for r in layer.rules)

    @property
    def limits(self) -> tuple[tuple[Limit, str], ...]:
        """Every limit with its layer's name, top to bottom."""
        return tuple((limit, layer.name) for layer in self.layers for limit in layer.limits)

    def limits_for(self, actions: Iterable[Action], *,
                   workspace: str | os.PathLike[str] | None = None
                   ) -> tuple[tuple[Limit, str], ...]:
        """The limits (each with its layer's name) any of `actions` meets, each once."""
        compiled: _Compiled | None = self._compiled  # type: ignore[attr-defined]
        if compiled is None:
            compiled = self._compile()
        if not compiled.limits:
            return ()
        met: dict[tuple[Limit, str], None] = {}
        for action in actions:
            for pair in compiled.limits_for(action, workspace):
                met[pair] = None
        return tuple(met)

    def check_arguments(self, tools: Iterable[Any]) -> None:
        """Refuse a value condition that names an argument a tool it covers does not have.

        `tools`: `ToolSpec`s (or anything with `.id` and `.input_schema`), e.g. a toolbox's
        or a manifest's. A CALL rule with conditions covers a tool when its pattern matches
        the tool's `server/name`; each condition's first pointer token must be a property of
        that tool's input schema (a schema that allows any property is not checked).

        Raises:
            PolicyError: naming the rule, its layer, the tool and the arguments it has.
        """
        conditional = [(layer.name, r) for layer in self.layers for r in layer.rules if r.when]
        if not conditional:
            return
        for tool in tools:
            schema = getattr(tool, "input_schema", None)
            if not isinstance(schema, Mapping):
                continue
            properties = schema.get("properties")
            if not isinstance(properties, Mapping) or schema.get("additionalProperties") not in (
                    None, False):
                continue
            target = Action(Act.CALL, str(tool.id))
            for layer, rule in conditional:
                alone = Policy((Layer(layer, (Rule(Act.CALL, rule.pattern, rule.effect),)),),
                               _NEUTRAL)
                if alone.check(target).rule is None:
                    continue
                for condition in rule.when:
                    if condition.pointer[0] not in properties:
                        has = ", ".join(sorted(str(k) for k in properties)) or "none"
                        raise PolicyError(
                            f"rule {rule.describe()} in layer {layer!r} reads the argument "
                            f"{condition.pointer[0]!r}, but tool '{tool.id}' has no such "
                            f"argument (its arguments: {has}): the condition could never be "
                            "decided — name one of its arguments")

    # -- values ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON-compatible form (the same structure as the TOML `[policy]`)."""
        from handrail.policy._toml import policy_to_dict

        return policy_to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "<policy>") -> Policy:
        """Build a policy from its dict form, strictly.

        Raises:
            PolicyError: an unknown key, act or effect, or a malformed rule; the message
                names `source` and the key path (`policy.layers[2].allow[0]`).
        """
        from handrail.policy._toml import policy_from_dict

        return policy_from_dict(data, source=source)

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<policy>") -> Policy:
        """Parse a policy file: a `[policy]` table, or its keys at the top level.

        Raises:
            PolicyError: invalid TOML or an invalid policy; the message names the line.
        """
        from handrail.policy._toml import policy_from_toml

        return policy_from_toml(text, source=source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Policy:
        """Read a policy file (see `from_toml`).

        Raises:
            PolicyError: the file is not a valid policy.
        """
        with open(path, encoding="utf-8") as f:
            text = f.read()
        return cls.from_toml(text, source=os.fspath(path))

    def to_toml(self) -> str:
        """The policy as a TOML document with a `[policy]` table (loads back identically)."""
        from handrail.policy._toml import policy_to_toml

        return policy_to_toml(self)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write `to_toml()` to `path`."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.to_toml())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Policy):
            return NotImplemented
        return (self.layers == other.layers and dict(self.defaults) == dict(other.defaults)
                and self.taint == other.taint)

    def __hash__(self) -> int:
        return hash((self.layers, tuple(self.defaults.items()), self.taint))

    def __repr__(self) -> str:
        names = ", ".join(f"{layer.name}({len(layer.rules)})" for layer in self.layers)
        defaults = ", ".join(f"{k}={v.value}" for k, v in self.defaults.items())
        taint = ", taint=deny" if self.taint == "deny" else ""
        return f"Policy(layers=[{names}], defaults={{{defaults}}}{taint})"


def _stricter_taint(a: str, b: str) -> str:
    return "deny" if "deny" in (a, b) else "ask"


_COMPILED: dict[Policy, _Compiled] = {}
"""Compiled forms by policy value (`Policy._compile`): a pure function of the rules."""

_COMPILED_KEPT = 64
"""Compiled policies kept at most (then they are all dropped, and compiled again as used)."""

_MEMO_SIZE = 4096
"""How many (act, canonical target) verdicts one compiled policy keeps."""

_NEUTRAL: Mapping[str, Effect] = MappingProxyType(dict.fromkeys(DEFAULT_KEYS, Effect.ALLOW))
"""The defaults of the one-rule policies a compiled policy matches one rule with."""

_UNKNOWN_ARGUMENTS = "the arguments are not known here"


def _scanner(matched: Sequence[tuple[int, int, bool, tuple[Any, ...], Rule, str, str]]
             ) -> Any:
    """`scan(arguments, rank) -> (met, unmet, met_why, unmet_why)`: the rules' loop, compiled.

    The index (in `matched`, strictest first) of the first rule whose conditions make it
    match, among those at least as strict as `rank`, else -1; and of the first that did not
    match before it, else -1; and the two rules' explanations, each what `_explain` says of
    it, or None when a value it read was not a plain number (the caller then asks
    `_explain`). Generated once per target's rules, like the copiers of the
    records: each argument a condition names at the top level is read once, and a number is
    compared inline; anything else goes through the condition's own `test`, which decides
    the same (a property test holds the two to it).
    """
    head = ["def scan(a, rank):", "    unmet = -1", "    why = None", "    d = type(a) is dict"]
    lines: list[str] = []
    namespace: dict[str, Any] = {"M": _MISSING_ARGUMENT, "B": 2 ** 200}
    keys: dict[str, str] = {}

    def var_of(key: str) -> str:
        var = keys.get(key)
        if var is None:
            var = keys[key] = f"v{len(keys)}"
            namespace[f"K_{var}"] = key
            # `n_` says the value is a plain number (an int of at most 200 bits, which an
            # explanation shows in full, or a float but NaN): then every condition on it is
            # decided by the compare alone, and explained by its text.
            head.extend([f"    {var} = a.get(K_{var}, M) if d else M",
                         f"    t = type({var})",
                         f"    n_{var} = (t is int and -B < {var} < B) or "
                         f"(t is float and {var} == {var})"])
        return var

    def text(i: int, j: int, var: str, condition: Condition, held: bool) -> str:
        """The expression of `condition.why(a)[1]` for a plain number in `var`."""
        name = f"{'H' if held else 'U'}_{i}_{j}"
        namespace[f"P_{i}_{j}"] = f"{condition.name} "
        namespace[name] = (f" {condition.op if held else _NOT[condition.op]} "
                           f"{condition.literal}")
        return f"P_{i}_{j} + (str({var}) if type({var}) is int else repr({var})) + {name}"

    if all(len(c.pointer) == 1 and type(c.value) in (int, float)
           for *_, rule, _, _ in matched for c in rule.when):
        lines += _plain_scan(matched, var_of, text)
    previous_rank = None
    for i, (_, rule_rank, strict, _, rule, _, _) in enumerate(matched):
        if rule_rank != previous_rank:  # sorted strictest first: the rank changes here only
            lines += [f"    if {rule_rank} < rank:", "        return -1, unmet, None, why"]
            previous_rank = rule_rank
        fast = [(var_of(c.pointer[0]), c) for c in rule.when
                if len(c.pointer) == 1 and type(c.value) in (int, float)]
        if len(fast) == len(rule.when):
            # Each value a plain number: the rule is one expression, decided for sure, and
            # its explanation (every condition when it matched, else the first that did not
            # hold) is built here, as `_explain` would build it.
            plain = " and ".join(sorted({f"n_{var}" for var, _ in fast}))
            expression = " and ".join(f"{var} {c.op} {c.value!r}" for var, c in fast)
            met_text = ' + "; " + '.join(text(i, j, var, c, True)
                                         for j, (var, c) in enumerate(fast))
            lines += [f"    if {plain}:", f"        if {expression}:",
                      f"            return {i}, unmet, {met_text}, why",
                      "        if unmet < 0:", f"            unmet = {i}"]
            for j, (var, c) in enumerate(fast):
                if j < len(fast) - 1:
                    lines += [f"            {'if' if j == 0 else 'elif'} not ({var} {c.op} "
                              f"{c.value!r}):",
                              f"                why = {text(i, j, var, c, False)}"]
                else:
                    lines += [f"            {'else:' if j else 'if True:'}",
                              f"                why = {text(i, j, var, c, False)}"]
            lines.append("    else:")
            indent = "    "
        else:
            indent = ""
        body = ["    met = True", "    unk = False"]
        for j, condition in enumerate(rule.when):
            test = f"T_{i}_{j}"
            namespace[test] = condition.test
            body.append("    if met:")
            if len(condition.pointer) == 1 and type(condition.value) in (int, float):
                var = var_of(condition.pointer[0])
                compare = f"{var} {condition.op} {condition.value!r}"
                body += [f"        t = type({var})",
                         "        if t is int:", f"            h = {compare}",
                         "        elif t is float:",
                         f"            h = ({compare}) if {var} == {var} else None",
                         "        else:", f"            h = {test}(a)"]
            else:
                body.append(f"        h = {test}(a)")
            body += ["        if h is False:", "            met = False",
                     "        elif h is None:", "            unk = True"]
        if not strict:
            body += ["    if unk:", "        met = False"]
        body += ["    if met:", f"        return {i}, unmet, None, why",
                 "    if unmet < 0:", f"        unmet = {i}"]
        lines += [indent + line for line in body]
    lines.append("    return -1, unmet, None, why")
    exec("\n".join(head + lines), namespace)
    return namespace["scan"]


def _plain_scan(matched: Sequence[tuple[int, int, bool, tuple[Any, ...], Rule, str, str]],
                var_of: Callable[[str], str],
                text: Callable[[int, int, str, Condition, bool], str]) -> list[str]:
    """The scan's first part when every condition compares a top-level argument with a number.

    When each of those arguments holds a plain number, every rule is one expression, decided
    for sure, and the first rule not met is the first one read (nothing is unknown).
    """
    rules = [[(var_of(c.pointer[0]), c) for c in rule.when] for *_, rule, _, _ in matched]
    plain = " and ".join(sorted({f"n_{var}" for fast in rules for var, _ in fast}))
    first = rules[0]
    # The first rule's explanation when it did not match: its first condition that failed.
    first_unmet = text(0, len(first) - 1, *first[-1], False)
    for j in range(len(first) - 2, -1, -1):
        var, c = first[j]
        first_unmet = (f"({text(0, j, var, c, False)} if not ({var} {c.op} {c.value!r}) "
                       f"else {first_unmet})")
    lines = [f"    if {plain}:"]
    previous_rank = None
    for i, ((_, rule_rank, *_), fast) in enumerate(zip(matched, rules, strict=True)):
        unmet, why = ("-1", "None") if i == 0 else ("0", first_unmet)
        if rule_rank != previous_rank:
            lines += [f"        if {rule_rank} < rank:",
                      f"            return -1, {unmet}, None, {why}"]
            previous_rank = rule_rank
        expression = " and ".join(f"{var} {c.op} {c.value!r}" for var, c in fast)
        met_text = ' + "; " + '.join(text(i, j, var, c, True)
                                     for j, (var, c) in enumerate(fast))
        # Met: the caller needs the first rule's explanation only when the verdict's own
        # rule sits higher up (rare): None, and `_explain` builds it then.
        lines += [f"        if {expression}:", f"            return {i}, {unmet}, {met_text}, None"]
    lines.append(f"        return -1, 0, None, {first_unmet}")
    return lines


_MISSING_ARGUMENT = object()


def _matches(rule: Rule, arguments: Any) -> bool:
    """Whether `rule`'s conditions make it match `arguments` (the hot path: no text).

    An undecidable condition (unknown arguments, a missing or uncomparable value) makes a deny
    or ask rule match and an allow rule not: the stricter verdict either way.
    """
    strict = rule.effect is not Effect.ALLOW
    if arguments is None:
        return strict
    unknown = False
    for condition in rule.when:
        holds = condition.test(arguments)
        if holds is False:
            return False
        if holds is None:
            unknown = True
    return strict or not unknown


def _explain(rule: Rule, arguments: Any) -> str:
    """Why `rule`'s conditions matched or not (`amount 900 > 500`), as `_matches` decided."""
    if arguments is None:
        strict = rule.effect is not Effect.ALLOW
        return f"{_UNKNOWN_ARGUMENTS}: {'matched' if strict else 'not matched'}"
    shown: list[str] = []
    for condition in rule.when:
        holds, why = condition.why(arguments)
        if holds is False:
            return why
        if holds is None:
            why += ", so the stricter verdict"
        shown.append(why)
    return "; ".join(shown)


class _Compiled:
    """A policy's rules compiled per act and effect, with precomputed explanations."""

    __slots__ = ("conditional", "conditional_memo", "defaults", "limit_memo", "limits",
                 "matchers", "memo", "rid_of", "roots", "rules")

    def __init__(self, policy: Policy) -> None:
        self.rules: list[tuple[Rule, str, str]] = []
        per_act: dict[Act, dict[Effect, list[tuple[int, Compiled]]]] = {
            act: {e: [] for e in _ORDER} for act in Act
        }
        # Rules with value conditions (CALL only) are kept apart: their verdict depends on
        # the arguments, so it cannot be memoised by target like the rest. Which of them a
        # target matches is memoised (`conditional_memo`); their conditions are evaluated on
        # every check. Each is matched by a one-rule policy of its own, so that it matches
        # exactly as the same rule without a condition would (folding included).
        self.conditional: list[tuple[int, Rule, str, str, Policy]] = []
        self.conditional_memo: dict[str, tuple[
            tuple[tuple[int, int, bool, tuple[Any, ...], Rule, str, str], ...], Any]] = {}
        self.rid_of: dict[str, int] = {}
        self.limits: list[tuple[Limit, str, Policy]] = []
        self.limit_memo: dict[tuple[str, str], tuple[tuple[Limit, str], ...]] = {}
        for layer in policy.layers:
            for rule in layer.rules:
                rid = len(self.rules)
                reason = f"rule {rule.describe()} in layer {layer.name!r}"
                self.rules.append((rule, layer.name, reason))
                if rule.when:
                    bare = Rule(rule.act, rule.pattern, rule.effect)
                    self.conditional.append((rid, rule, layer.name, reason, Policy(
                        (Layer(layer.name, (bare,)),), _NEUTRAL)))
                    continue
                self.rid_of.setdefault(reason, rid)
                per_act[rule.act][rule.effect].append(
                    (rid, compile_pattern(rule.act, rule.pattern))
                )
            for limit in layer.limits:
                # A limit's pattern matches as a deny rule's does (any letter case): when in
                # doubt, a call counts.
                self.limits.append((limit, layer.name, Policy(
                    (Layer(layer.name, (Rule(limit.act, limit.pattern, Effect.DENY),)),),
                    _NEUTRAL)))
        # Strictest first, then top to bottom: the first conditional rule that matches is
        # the one a verdict names among them.
        self.conditional.sort(key=lambda c: (-c[1].effect.rank, c[0]))
        # Keyed by the act's string value: Enum.__hash__ runs in Python, str hashes are cached.
        self.matchers: dict[str, tuple[_EffectMatcher, ...]] = {
            act.value: tuple(_EffectMatcher(e, by_effect[e]) for e in _ORDER if by_effect[e])
            for act, by_effect in per_act.items()
        }
        self.roots: dict[str, str] = {}
        # Matching a canonical target is a pure function of the (immutable) rules: agents
        # check the same few targets over and over, so the answer is kept, bounded. Paths are
        # still canonicalised on every check (the filesystem may change); only the matching
        # of the canonical form is memoised.
        self.memo: dict[
            tuple[str, str, tuple[str, ...], tuple[str, ...] | None, bool], Verdict
        ] = {}
        self.defaults: dict[tuple[str, bool], tuple[Effect, str]] = {}
        for act in Act:
            for mutates in (True, False):
                effect = policy.default_for(act, mutates=mutates)
                why = f"default for {act.value}"
                if act is Act.CALL and not mutates:
                    why += " (the tool declares mutates=False)"
                self.defaults[act.value, mutates] = (effect, why)

    def _root(self, workspace: str | os.PathLike[str] | None) -> str:
        if workspace is None:
            return workspace_root(None)
        # The root is resolved once per policy: it is the operator's choice, fixed for the
        # run, and its parents lie outside the workspace, where no action may write.
        key = os.fspath(workspace)
        root = self.roots.get(key)
        if root is None:
            if len(self.roots) > 64:
                self.roots.clear()
            root = self.roots[key] = workspace_root(key)
        return root

    def check(
        self, action: Action, workspace: str | os.PathLike[str] | None, mutates: bool,
        arguments: Any = None,
    ) -> Verdict:
        verdict = self._check(action, workspace, mutates)
        # `_CALL`, not `Act.CALL`: an enum member looked up on its class costs ~10x a global.
        if self.conditional and action.act is _CALL and verdict.layer != CONFINEMENT:
            return self._conditioned(verdict, arguments)
        return verdict

    def _conditioned(self, verdict: Verdict, arguments: Any) -> Verdict:
        """`verdict` (of the rules without conditions) with the conditional rules applied.

        Deny-first still: the strictest matching rule decides, whichever kind; a tie goes to
        the one higher up. Any matching rule beats the default.
        """
        target = verdict.target
        known = self.conditional_memo.get(target)
        if known is None:
            action = Action(Act.CALL, target)
            # Per rule what the loop below reads, precomputed: its rank, whether it is strict
            # (deny, ask), its conditions' fast tests.
            matched = tuple((rid, rule.effect.rank, rule.effect is not Effect.ALLOW,
                             tuple(c.test for c in rule.when), rule, layer, reason)
                            for rid, rule, layer, reason, alone in self.conditional
                            if alone.check(action).rule is not None)
            known = (matched, _scanner(matched) if matched else None)
            if len(self.conditional_memo) >= _MEMO_SIZE:
                self.conditional_memo.clear()
            self.conditional_memo[target] = known
        matched, scan = known
        if not matched:
            return verdict
        decided = verdict.rule is not None
        if decided:
            # `Effect.rank` hashes the member (a Python-level `__hash__`): identity is cheaper.
            effect = verdict.effect
            rank = 2 if effect is _DENY else 1 if effect is _ASK else 0
        else:
            rank = -1
        if arguments is not None:
            # The loop below, compiled for these rules (`_scanner`): what it decides, faster.
            # Its explanations too when every value it read was a plain number; else None,
            # and `_explain` builds them.
            met, first_unmet, met_why, unmet_why = scan(arguments, rank)
            if met >= 0:
                rid, rule_rank, _, _, rule, layer, reason = matched[met]
                if not (rule_rank == rank and self.rid_of.get(verdict.reason, -1) < rid):
                    return _make_verdict(rule.effect, rule, layer, target, f"{reason} ("
                                         f"{met_why or _explain(rule, arguments)})")
            if first_unmet < 0:
                return verdict
            rule, reason = matched[first_unmet][4], matched[first_unmet][6]
            return _make_verdict(verdict.effect, verdict.rule, verdict.layer, target,
                                 f"{verdict.reason}; not met: {reason} "
                                 f"({unmet_why or _explain(rule, arguments)})")
        unmet: tuple[Rule, str] | None = None
        for rid, rule_rank, strict, tests, rule, layer, reason in matched:
            if rule_rank < rank:
                break  # sorted strictest first: nothing later can beat the verdict
            # `_matches`, inlined: this loop is the whole cost of the conditions.
            if arguments is None:
                met = strict
            else:
                met, unknown = True, False
                for test in tests:
                    holds = test(arguments)
                    if holds is False:
                        met = False
                        break
                    if holds is None:
                        unknown = True
                if unknown and not strict:
                    met = False
            if not met:
                if unmet is None:
                    unmet = (rule, reason)
                continue
            if rule_rank == rank and self.rid_of.get(verdict.reason, -1) < rid:
                break  # the same effect, and the verdict's rule sits higher up
            return _make_verdict(rule.effect, rule, layer, target,
                                 f"{reason} ({_explain(rule, arguments)})")
        if unmet is not None:
            # Explain says which condition let the call through (or kept it at its default).
            return _make_verdict(verdict.effect, verdict.rule, verdict.layer, target,
                                 f"{verdict.reason}; not met: {unmet[1]} "
                                 f"({_explain(unmet[0], arguments)})")
        return verdict

    def limits_for(self, action: Action, workspace: str | os.PathLike[str] | None
                   ) -> tuple[tuple[Limit, str], ...]:
        """The limits (with their layers) `action` meets."""
        if not self.limits:
            return ()
        act = action.act
        if act is Act.CALL and isinstance(action.target, str):
            key = (act._value_, action.target)
            known = self.limit_memo.get(key)
            if known is not None:
                return known
        else:
            key = None
        met = tuple((limit, layer) for limit, layer, alone in self.limits
                    if limit.act is act and alone.check(action, workspace=workspace
                                                        ).rule is not None)
        if key is not None:
            if len(self.limit_memo) >= _MEMO_SIZE:
                self.limit_memo.clear()
            self.limit_memo[key] = met
        return met

    def _check(
        self, action: Action, workspace: str | os.PathLike[str] | None, mutates: bool
    ) -> Verdict:
        if not isinstance(action, Action):
            raise UserError(f"Policy.check takes an hr.Action, not {type(action).__name__}")
        act = action.act
        key = act._value_
        raw_target = action.target
        allow_full: tuple[str, ...] | None = None
        addresses: tuple[IpAddress, ...] = ()
        try:
            if act is Act.READ or act is Act.WRITE:
                assert isinstance(raw_target, str)
                target = canonical_path(raw_target, self._root(workspace))
                full: tuple[str, ...] = (target,)
                base: tuple[str, ...] = (target.rpartition("/")[2],)
            elif act is Act.EXEC:
                assert isinstance(raw_target, tuple)
                target, full, allow_full = canonical_exec(raw_target, self._root(workspace))
                base = ()
            elif act is Act.NET:
                assert isinstance(raw_target, str)
                full = canonical_net(raw_target)
                target, base = full[0], ()
                addresses = net_addresses(full)
            else:
                assert isinstance(raw_target, str)
                full = canonical_call(raw_target)
                target, base = full[0], ()
        except OutsideWorkspace:
            return Verdict._make(Effect.DENY, None, CONFINEMENT, _shown(raw_target),
                           "path resolves outside the workspace")
        except UncanonicalTarget as exc:
            return Verdict._make(Effect.DENY, None, CONFINEMENT, _shown(raw_target),
                           f"target cannot be canonicalised: {exc}")
        memo_key = (key, target, full, allow_full, bool(mutates))
        known = self.memo.get(memo_key)
        if known is not None:
            return known
        verdict = self._match(key, act, target, full, base, mutates, allow_full, addresses)
        if len(self.memo) >= _MEMO_SIZE:
            self.memo.clear()
        self.memo[memo_key] = verdict
        return verdict

    def check_canonical_path(self, act: Act, target: str) -> Verdict:
        full = (target,)
        memo_key = (act._value_, target, full, None, True)
        known = self.memo.get(memo_key)
        if known is not None:
            return known
        verdict = self._match(act._value_, act, target, full, (target.rpartition("/")[2],),
                              True)
        if len(self.memo) >= _MEMO_SIZE:
            self.memo.clear()
        self.memo[memo_key] = verdict
        return verdict

    def _match(self, key: str, act: Act, target: str, full: tuple[str, ...],
               base: tuple[str, ...], mutates: bool,
               allow_full: tuple[str, ...] | None = None,
               addresses: tuple[IpAddress, ...] = ()) -> Verdict:
        matchers = self.matchers[key]
        if matchers:
            ascii_only = target.isascii() and all(c.isascii() for c in full)
            # Allow rules may see fewer candidates than deny and ask (EXEC: a bare program
            # name only when it was found on PATH); they match exactly, never folded.
            raw = (prepare(full, act, segmented=True), prepare(base, act, segmented=False))
            allow_raw = raw
            if allow_full is not None:
                # A subset of `full`, already split once: pick, don't split again.
                keep = set(allow_full)
                allow_raw = (tuple(p for p in raw[0] if p[0] in keep), raw[1])
            folded: tuple[Sequence[Prepared], Sequence[Prepared]] | None = None
            strict_raw = raw
            for matcher in matchers:
                if matcher.folded is not None and folded is None:
                    if ascii_only:
                        folded_full: Sequence[str] = tuple(c.lower() for c in full)
                        folded_base: Sequence[str] = tuple(c.lower() for c in base)
                    else:
                        raw_full, folded_full = _variants(full)
                        raw_base, folded_base = _variants(base)
                        strict_raw = (prepare(raw_full, act, segmented=True),
                                      prepare(raw_base, act, segmented=False))
                    folded = (prepare(folded_full, act, segmented=True),
                              prepare(folded_base, act, segmented=False))
                cands = strict_raw if matcher.folded is not None else allow_raw
                rid = matcher.first(cands, folded, ascii_only, addresses)
                if rid is not None:
                    rule, layer, reason = self.rules[rid]
                    return Verdict._make(matcher.effect, rule, layer, target, reason)
        effect, why = self.defaults[key, bool(mutates)]
        return Verdict._make(effect, None, None, target, why)
