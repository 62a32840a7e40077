"""`AskTerms`: how an `ask` rule's approval is decided beyond one person's yes or no.

```python
policy.ask("call", "ledger/transfer/*", approvals=2, expires="30m", escalate="10m")
```

```toml
ask = [{ rule = "call:ledger/transfer/*", approvals = 2, expires = "30m", escalate = "10m" }]
```

`approvals`: how many distinct people must approve (four-eyes: 2); any deny ends it.
`expires`: after this long undecided, `default` is recorded by "expiry" (`deny`, with the
reason "expired after 30m", unless the rule says `approve`). `escalate`: after this long
undecided (before `expires`), a second notification goes to the escalation target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from handrail.errors import PolicyError

__all__ = ["AskTerms", "format_duration", "parse_duration"]

MAX_APPROVALS = 10
"""The most distinct approvers a rule may require."""
MAX_SECONDS = 90 * 86400.0
"""The longest deadline (90 days)."""

_DURATION = re.compile(r"^\s*(?:(\d{1,6})d)?\s*(?:(\d{1,6})h)?\s*(?:(\d{1,6})m)?\s*"
                       r"(?:(\d{1,6})s)?\s*$")


def parse_duration(value: object, *, what: str) -> float:
    """Seconds from `"30m"`, `"1h30m"`, `"2d"`, `"45s"` or a positive number of seconds.

    Raises:
        PolicyError: not a positive duration of at most 90 days.
    """
    seconds: float
    if isinstance(value, bool):
        raise PolicyError(f"{what} is a duration such as '30m' or a number of seconds")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        m = _DURATION.match(value)
        if m is None or not any(m.groups()):
            raise PolicyError(f"{what} {value!r} is not a duration: write e.g. '45s', '30m', "
                              "'1h30m' or '2d'")
        d, h, mi, s = (int(g) if g else 0 for g in m.groups())
        seconds = float(((d * 24 + h) * 60 + mi) * 60 + s)
    else:
        raise PolicyError(f"{what} is a duration such as '30m' or a number of seconds")
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise PolicyError(f"{what} must be more than 0 and at most 90 days; got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """`1800` -> `"30m"`, `5400` -> `"1h30m"`, `45` -> `"45s"`."""
    whole = round(seconds)
    if whole <= 0:
        return f"{seconds:g}s"
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if whole >= size:
            parts.append(f"{whole // size}{unit}")
            whole %= size
    return "".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class AskTerms:
    """How an approval asked by a rule is decided: approvers, deadline, default, escalation."""

    approvals: int = 1
    """Distinct people who must approve (1 to 10); any deny ends it."""
    expires: float | None = None
    """Seconds after which `default` is recorded by "expiry"; None: never."""
    default: Literal["deny", "approve"] = "deny"
    """What expiry records."""
    escalate: float | None = None
    """Seconds after which a second notification goes to the escalation target; None: none."""

    def __post_init__(self) -> None:
        if isinstance(self.approvals, bool) or not isinstance(self.approvals, int) or \
                not 1 <= self.approvals <= MAX_APPROVALS:
            raise PolicyError(f"approvals is a whole number from 1 to {MAX_APPROVALS}; got "
                              f"{self.approvals!r}")
        if self.expires is not None:
            object.__setattr__(self, "expires", parse_duration(self.expires, what="expires"))
        if self.escalate is not None:
            object.__setattr__(self, "escalate", parse_duration(self.escalate,
                                                                what="escalate"))
        if self.default not in ("deny", "approve"):
            raise PolicyError(f"default is 'deny' or 'approve'; got {self.default!r}")
        if self.default != "deny" and self.expires is None:
            raise PolicyError("default = 'approve' needs expires: it is what expiry records")
        if self.escalate is not None and self.expires is not None and \
                self.escalate >= self.expires:
            raise PolicyError(f"escalate ({format_duration(self.escalate)}) must come before "
                              f"expires ({format_duration(self.expires)}): escalation "
                              "notifies a second person before the default applies")

    @property
    def plain(self) -> bool:
        """True when these are the terms of every ask (one approver, no deadline)."""
        return self == AskTerms()

    def on_expiry(self) -> dict[str, Any] | None:
        """The decision expiry records (a `Decision` dict), or None without a deadline."""
        if self.expires is None:
            return None
        if self.default == "approve":
            return {"kind": "approve", "modified": None, "remember": [],
                    "reason": f"approved by default after {format_duration(self.expires)}"}
        return {"kind": "deny", "reason": f"expired after {format_duration(self.expires)}"}

    def item_fields(self, now: float) -> dict[str, Any]:
        """The `PendingItem` fields these terms give an item created at `now`."""
        return {
            "approvals_needed": self.approvals,
            "deadline": None if self.expires is None else now + self.expires,
            "on_expiry": self.on_expiry(),
            "escalate_at": None if self.escalate is None else now + self.escalate,
        }

    def to_dict(self) -> dict[str, Any]:
        """The policy file's form: only what differs from a plain ask."""
        out: dict[str, Any] = {}
        if self.approvals != 1:
            out["approvals"] = self.approvals
        if self.expires is not None:
            out["expires"] = format_duration(self.expires)
        if self.default != "deny":
            out["default"] = self.default
        if self.escalate is not None:
            out["escalate"] = format_duration(self.escalate)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AskTerms:
        """The inverse of `to_dict`.

        Raises:
            PolicyError: an unknown key or a malformed value.
        """
        unknown = set(data) - {"approvals", "expires", "default", "escalate"}
        if unknown:
            raise PolicyError(f"unknown ask option(s) {sorted(unknown)} (expected approvals, "
                              "expires, default, escalate)")
        return cls(approvals=data.get("approvals", 1), expires=data.get("expires"),
                   default=data.get("default", "deny"), escalate=data.get("escalate"))

    @classmethod
    def strictest(cls, terms: Iterable[AskTerms | None]) -> AskTerms:
        """One set of terms for a request several rules asked about.

        The most approvers, the earliest deadline and escalation, and `deny` unless every
        rule's default is approve.
        """
        given = [t for t in terms if t is not None]
        if not given:
            return cls()
        expires = [t.expires for t in given if t.expires is not None]
        escalate = [t.escalate for t in given if t.escalate is not None]
        default: Literal["deny", "approve"] = (
            "approve" if expires and all(t.default == "approve" for t in given
                                         if t.expires is not None)
            and all(t.expires is not None for t in given) else "deny")
        first = min(expires) if expires else None
        soon = min(escalate) if escalate else None
        if soon is not None and first is not None and soon >= first:
            soon = None  # the deadline comes first: nothing to escalate before it
        return cls(approvals=max(t.approvals for t in given), expires=first,
                   default=default, escalate=soon)
