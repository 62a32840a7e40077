"""Who may use the inbox: login tokens, signed session cookies, CSRF tokens.

Whoever can press "approve" can make an agent write files and run programs, so nothing of
the inbox answers without a session. A session starts from a login token (printed once by
`handrail inbox`, or read from `--token-file`) and lives in this process only: the cookie
carries a random session id signed with a per-process key (HMAC-SHA256), HttpOnly and
SameSite=Strict; a restart logs everyone out. Each session has its own CSRF token, required
on every state-changing request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field

__all__ = ["COOKIE", "Session", "Sessions"]

COOKIE = "handrail_session"
"""The session cookie's name."""

_MAX_NAME = 64


@dataclass(frozen=True, slots=True)
class Session:
    """One logged-in person."""

    id: str
    """Random, secret; the cookie carries it signed."""
    user: str
    """The name recorded as `decided_by`."""
    csrf: str
    """The token every state-changing request must carry."""
    expires: float
    """Unix time the session ends."""


@dataclass(slots=True)
class Sessions:
    """The login tokens and sessions of one inbox process.

    Args:
        one_time: Tokens that each open one session, then stop working (the printed one).
        reusable: Tokens that keep working (from `--token-file`, shared with a team).
        lifetime: Seconds a session lasts.
    """

    one_time: set[str] = field(default_factory=set)
    reusable: set[str] = field(default_factory=set)
    lifetime: float = 12 * 3600.0
    _key: bytes = field(default_factory=lambda: secrets.token_bytes(32))
    _sessions: dict[str, Session] = field(default_factory=dict)

    def new_login_token(self) -> str:
        """A fresh one-time login token."""
        token = secrets.token_urlsafe(24)
        self.one_time.add(token)
        return token

    def login(self, token: str, user: str) -> Session | None:
        """Exchange a login token for a session; None when the token is not (or no longer) valid.

        The comparison runs over every known token in constant time per token, so the time
        taken says nothing about how close a guess was.
        """
        user = clean_user(user)
        if not user or not token:
            return None
        matched_one_time = None
        for known in self.one_time:
            if hmac.compare_digest(known.encode(), token.encode()):
                matched_one_time = known
        matched = matched_one_time is not None or any(
            hmac.compare_digest(known.encode(), token.encode()) for known in self.reusable)
        if not matched:
            return None
        if matched_one_time is not None:
            self.one_time.discard(matched_one_time)
        session = Session(id=secrets.token_urlsafe(24), user=user,
                          csrf=secrets.token_urlsafe(24), expires=time.time() + self.lifetime)
        self._sessions[session.id] = session
        return session

    def cookie_value(self, session: Session) -> str:
        """What the cookie holds: the session id and its signature."""
        return f"{session.id}.{self._sign(session.id)}"

    def from_cookie(self, value: str | None) -> Session | None:
        """The live session a cookie names, or None (absent, forged, unknown or expired)."""
        if not value or len(value) > 200:
            return None
        sid, _, signature = value.rpartition(".")
        if not sid or not hmac.compare_digest(self._sign(sid).encode(), signature.encode()):
            return None
        session = self._sessions.get(sid)
        if session is None:
            return None
        if session.expires < time.time():
            self._sessions.pop(sid, None)
            return None
        return session

    def logout(self, session: Session) -> None:
        """End a session."""
        self._sessions.pop(session.id, None)

    def _sign(self, sid: str) -> str:
        return hmac.new(self._key, sid.encode(), hashlib.sha256).hexdigest()


def clean_user(name: str) -> str:
    """A person's name as recorded: printable, single-line, at most 64 characters."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(name))
    return " ".join(text.split())[:_MAX_NAME]


def csrf_ok(session: Session, sent: str | None) -> bool:
    """Whether a request carried this session's CSRF token."""
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), str(sent).encode())
