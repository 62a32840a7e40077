"""`Decision`: what an approver answers — `Approve`, `Deny` or `Defer`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from handrail.errors import PolicyError, UserError
from handrail.policy import AskTerms, parse_duration
from handrail.policy._policy import Effect, Rule, parse_act
from handrail.tools import Act

__all__ = ["Approve", "Decision", "Defer", "Deny"]


class Decision:
    """An approver's answer to a `Request`. Build one with the classmethods.

    `Decision.approve()`, `Decision.approve(modified={...}, remember=["src/**"])`,
    `Decision.deny("not on Fridays")`, `Decision.defer()`.
    """

    __slots__ = ()
    kind: ClassVar[str]

    @classmethod
    def approve(
        cls,
        modified: Mapping[str, Any] | None = None,
        remember: Iterable[Rule | str] = (),
    ) -> Approve:
        """Approve the call.

        Args:
            modified: replacement arguments; the gate re-validates and re-checks them, so
                an approver can never rewrite an action across a deny.
            remember: rules (or bare patterns, meaning "allow this request's act on it")
                to install for the rest of the run; they never beat a deny.
        """
        return Approve(modified=None if modified is None else dict(modified),
                       remember=tuple(remember))

    @classmethod
    def deny(cls, reason: str) -> Deny:
        """Refuse the call; `reason` reaches the model as the call's error result."""
        return Deny(reason=reason)

    @classmethod
    def defer(cls, *, expires: float | str | None = None,
              default: Literal["deny", "approve"] = "deny") -> Defer:
        """Decide later: the request is persisted and the run pauses (AwaitingApproval).

        Args:
            expires: After this long undecided (`"30m"`, or seconds), `default` is recorded
                by "expiry" (the rule's own deadline, if earlier, stands).
            default: What expiry records: `"deny"` ("expired after 30m") or `"approve"`.
        """
        return Defer(expires=None if expires is None else parse_duration(expires,
                                                                          what="expires"),
                     default=default)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible form, tagged by `kind`."""
        raise NotImplementedError

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        """The inverse of `to_dict`, for any of the three kinds.

        Raises:
            UserError: not a persisted decision.
        """
        kind = data.get("kind")
        if kind == "approve":
            remember: list[Rule | str] = [
                r if isinstance(r, str) else Rule.from_dict(r) for r in data.get("remember", ())
            ]
            return Approve(modified=data.get("modified"), remember=tuple(remember))
        if kind == "deny":
            return Deny(reason=data["reason"])
        if kind == "defer":
            return Defer(expires=data.get("expires"), default=data.get("default", "deny"))
        raise UserError(f"not a decision: kind {kind!r} (expected approve, deny or defer)")


@dataclass(frozen=True, kw_only=True, slots=True)
class Approve(Decision):
    """Go ahead (possibly with modified arguments, possibly remembering rules)."""

    modified: dict[str, Any] | None = None
    """Replacement arguments, or None to run the call as requested."""
    remember: tuple[Rule | str, ...] = ()
    """Rules for the rest of the run; a bare pattern allows the request's act on it."""
    kind: ClassVar[Literal["approve"]] = "approve"

    def __post_init__(self) -> None:
        if self.modified is not None and not isinstance(self.modified, Mapping):
            raise UserError("Decision.approve(modified=...) takes the replacement arguments "
                            "as a dict")
        remember = tuple(self.remember)
        for item in remember:
            if not isinstance(item, Rule | str):
                raise UserError(f"remember takes hr.Rule or pattern strings, not {item!r}")
        object.__setattr__(self, "remember", remember)

    def check(self, act: Act | str) -> None:
        """Raise `UserError` unless this approval can be applied to a request of `act`.

        Called BEFORE a decision is recorded: a decision that would fail when applied (a
        remembered pattern malformed for the act, replacement arguments that are not a JSON
        object) is refused whole, so it can never be recorded and then brick its run.
        """
        try:
            if self.remember:
                self.remember_rules(act)
        except PolicyError as exc:
            raise UserError(f"this approval cannot be applied: {exc}") from None
        if self.modified is not None:
            try:
                json.dumps(self.modified, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise UserError(f"this approval cannot be applied: its modified arguments "
                                f"are not a JSON object ({exc})") from None
            if any(not isinstance(k, str) for k in self.modified):
                raise UserError("this approval cannot be applied: its modified arguments "
                                "must have string keys")

    def remember_rules(self, act: Act | str) -> list[Rule]:
        """`remember` as rules: each bare pattern becomes `allow act pattern`.

        Raises:
            PolicyError: a remembered pattern is malformed for `act`.
        """
        act = parse_act(act)
        return [r if isinstance(r, Rule) else Rule(act, r, Effect.ALLOW) for r in self.remember]

    def to_dict(self) -> dict[str, Any]:
        """`{"kind": "approve", "modified": ..., "remember": [...]}`."""
        return {
            "kind": "approve",
            "modified": self.modified,
            "remember": [r if isinstance(r, str) else r.to_dict() for r in self.remember],
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class Deny(Decision):
    """Refuse; the reason is the call's error result, which the model sees."""

    reason: str
    """Why, in words the model can act on."""
    kind: ClassVar[Literal["deny"]] = "deny"

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise UserError("Decision.deny needs a reason: the model sees it and can adapt")

    def to_dict(self) -> dict[str, Any]:
        """`{"kind": "deny", "reason": ...}`."""
        return {"kind": "deny", "reason": self.reason}


@dataclass(frozen=True, kw_only=True, slots=True)
class Defer(Decision):
    """Decide later: persist the request and pause the run."""

    expires: float | None = None
    """Seconds after which `default` is recorded by "expiry"; None: no deadline of its own."""
    default: Literal["deny", "approve"] = "deny"
    """What expiry records."""
    kind: ClassVar[Literal["defer"]] = "defer"

    def __post_init__(self) -> None:
        try:
            self.terms()
        except PolicyError as exc:
            raise UserError(f"Decision.defer: {exc}") from None

    def terms(self) -> AskTerms:
        """The deadline this deferral gives the item, as `AskTerms`."""
        return AskTerms(expires=self.expires, default=self.default)

    def to_dict(self) -> dict[str, Any]:
        """`{"kind": "defer"}` (with `expires` and `default` when it sets a deadline)."""
        if self.expires is None:
            return {"kind": "defer"}
        return {"kind": "defer", "expires": self.expires, "default": self.default}
