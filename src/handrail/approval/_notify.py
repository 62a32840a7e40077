"""Notifications out, decisions in: what waits for a person reaches them where they are.

- `Notification`: what is sent when an item becomes pending (an approval, a question, a
  recovery) or is escalated: the item, its run, agent path, tool, the policy's reason, the
  taint lines, a link into the inbox, and for an approval one-time decision links.
- `Notifier`: the seam (`async send(notification)`, raising on failure);
  `WebhookNotifier` POSTs it as JSON (`shape="json"`) or as a chat incoming-webhook's
  `text` + `blocks` (`shape="chat"`), signed with HMAC-SHA256 over a timestamp and the body
  (`Handrail-Signature: t=...,v1=...`).
- The sender is `handrail.web.Dispatcher` (it reads the store, which this layer does not).
- `verify_signature` and `WebhookVerifier`: what a receiver uses to check a delivery
  (signature, age, and, with the verifier, a delivery id seen twice: a replay).
- `DecisionLinks`: signed, expiring, one-time approve / deny links that open the inbox's
  confirmation page (never a decision on a GET).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import os
import time
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from handrail.errors import DeliveryFailed, SignatureInvalid, UserError

__all__ = ["DELIVERY_HEADER", "SIGNATURE_HEADER", "DecisionLinks", "LinkClaim", "Notification",
           "Notifier", "WebhookNotifier", "WebhookVerifier", "clean", "default_backoff", "sign",
           "verify_signature"]

SIGNATURE_HEADER = "Handrail-Signature"
"""`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>." + body>`."""
DELIVERY_HEADER = "Handrail-Delivery"
"""The delivery's id: the same for every retry of one notification (a receiver dedupes on it)."""
TOLERANCE = 300.0
"""How old (or how far ahead) a signed timestamp may be, in seconds, by default."""
MAX_TEXT = 2000
"""The most characters of any one text a notification carries (reasons, targets, arguments)."""
MAX_TAINT_LINES = 20
MAX_TOKEN = 1024
"""The longest decision-link token read (anything longer is refused unread)."""


def _key(secret: str | bytes, what: str) -> bytes:
    key = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(key, bytes) or len(key) < 16:
        raise UserError(f"{what} needs a secret of at least 16 bytes (e.g. `openssl rand "
                        "-hex 32`, kept in a file, never in the code)")
    return key


def sign(secret: str | bytes, body: bytes, *, timestamp: int) -> str:
    """The `Handrail-Signature` header value for `body` sent at `timestamp`."""
    mac = hmac.new(_key(secret, "sign"), f"{timestamp}.".encode() + body,
                   hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


def verify_signature(secret: str | bytes, body: bytes, header: str | None, *,
                     now: float | None = None, tolerance: float = TOLERANCE) -> int:
    """Check a delivery's signature and age; return its timestamp.

    Use the raw body bytes as received (before any JSON parsing). A delivery older (or
    further ahead) than `tolerance` seconds is refused: a captured delivery replayed later
    fails here; one replayed within the window is caught by `WebhookVerifier`'s memory of
    delivery ids.

    Raises:
        SignatureInvalid: no header, a malformed one, a wrong signature, or too old.
    """
    if not header or len(header) > 512:
        raise SignatureInvalid(f"no usable {SIGNATURE_HEADER} header")
    parts: dict[str, list[str]] = {}
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            parts.setdefault(name, []).append(value)
    stamp = (parts.get("t") or [""])[0]
    if not stamp.isdigit() or len(stamp) > 12:
        raise SignatureInvalid(f"{SIGNATURE_HEADER} has no timestamp t=")
    timestamp = int(stamp)
    expected = hmac.new(_key(secret, "verify_signature"), f"{timestamp}.".encode() + body,
                        hashlib.sha256).hexdigest()
    # Every v1 is compared (a sender rotating its secret may send two); in constant time.
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise SignatureInvalid("the signature does not match the body (wrong secret, or the "
                               "body was changed)")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise SignatureInvalid(f"the signature is {abs(current - timestamp):.0f}s off the "
                               f"clock (at most {tolerance:.0f}s): a replay, or a clock to fix")
    return timestamp


class WebhookVerifier:
    """What a receiver keeps to check deliveries: the secret, and the delivery ids it saw.

    `verify(body, headers)` checks the signature and age (`verify_signature`), then refuses
    a delivery id it has already accepted within the tolerance window (a replay of a
    captured delivery, or a retry of one that did arrive), and returns the parsed JSON.
    Ids older than the window are forgotten: the age check refuses those.
    """

    def __init__(self, secret: str | bytes, *, tolerance: float = TOLERANCE,
                 clock: Callable[[], float] = time.time) -> None:
        self._secret = _key(secret, "WebhookVerifier")
        if not (isinstance(tolerance, int | float) and 0 < tolerance <= 3600):
            raise UserError("WebhookVerifier(tolerance=...) is seconds in (0, 3600]")
        self.tolerance = float(tolerance)
        self.clock = clock
        self._seen: dict[str, float] = {}

    def verify(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any]:
        """The delivery's JSON, once it checks out.

        Raises:
            SignatureInvalid: forged, too old, or a delivery id seen before.
        """
        lowered = {k.lower(): v for k, v in headers.items()}
        now = self.clock()
        verify_signature(self._secret, body, lowered.get(SIGNATURE_HEADER.lower()), now=now,
                         tolerance=self.tolerance)
        delivery = lowered.get(DELIVERY_HEADER.lower(), "")
        if not delivery or len(delivery) > 200:
            raise SignatureInvalid(f"no {DELIVERY_HEADER} header")
        for seen, at in list(self._seen.items()):
            if at < now - 2 * self.tolerance:
                del self._seen[seen]
        if delivery in self._seen:
            raise SignatureInvalid(f"delivery {delivery} was already received: a replay")
        self._seen[delivery] = now
        try:
            data = json.loads(body)
        except ValueError as exc:
            raise SignatureInvalid(f"the body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SignatureInvalid("the body is not a JSON object")
        return data


def clean(text: object, limit: int = MAX_TEXT) -> str:
    # Text a model or a tool may have written, made safe to carry: no control or format
    # characters (escape sequences, bidi overrides), at most `limit` characters.
    raw = str(text)
    out = "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else "\ufffd"
                  for c in raw[:limit])
    return out if len(raw) <= limit else out + "…"


@dataclass(frozen=True, kw_only=True, slots=True)
class Notification:
    """What a `Notifier` sends about one pending item."""

    id: str
    """The delivery id (`<item>:<stage>`): the same for every retry of this notification."""
    event: Literal["pending", "escalation"]
    """`pending`: the item is new; `escalation`: still undecided after the first deadline."""
    item_id: str
    """The item (what `handrail approve ID` takes)."""
    item_kind: str
    """`approval`, `question` or `recovery`."""
    run_id: str
    """The paused run."""
    agent: str | None
    """The agent's name."""
    agent_path: tuple[str, ...]
    """Who asks, from the root of a tree of agents (empty outside a tree)."""
    tool: str | None
    """The tool's id."""
    summary: str
    """One line: the act and target, the question, or the call in doubt."""
    reason: str
    """Why the policy asked (its rule and layer), or why the item exists."""
    taint: tuple[str, ...] = ()
    """One line per argument that came from untrusted tool output."""
    inbox_url: str | None = None
    """The item's page in the inbox, when the dispatcher knows the inbox's address."""
    approve_url: str | None = None
    """A one-time, expiring link to the inbox's confirmation page for approving."""
    deny_url: str | None = None
    """The same, for denying."""
    deadline: float | None = None
    """When the default applies (Unix time), if the item has a deadline."""
    on_expiry: str | None = None
    """What happens at the deadline: `deny` or `approve`."""
    approvals_needed: int = 1
    """Distinct approvers needed; `approvals_so_far` of them approved."""
    approvals_so_far: int = 0
    """Approvals counted so far."""
    created_at: float = 0.0
    """When the item was created."""

    def to_json(self) -> dict[str, Any]:
        """The plain JSON shape (`shape="json"`): every field, `"type": "handrail.pending"`."""
        return {
            "type": f"handrail.{self.event}", "id": self.id, "item": self.item_id,
            "kind": self.item_kind, "run": self.run_id, "agent": self.agent,
            "agent_path": list(self.agent_path), "tool": self.tool, "summary": self.summary,
            "reason": self.reason, "taint": list(self.taint), "inbox_url": self.inbox_url,
            "approve_url": self.approve_url, "deny_url": self.deny_url,
            "deadline": self.deadline, "on_expiry": self.on_expiry,
            "approvals_needed": self.approvals_needed,
            "approvals_so_far": self.approvals_so_far, "created_at": self.created_at,
        }

    def text(self) -> str:
        """One plain line for people (a chat message's `text`, a mail subject)."""
        who = "/".join(self.agent_path) or self.agent or "an agent"
        what = {"approval": "asks to", "question": "asks", "recovery": "needs a recovery:"}
        head = "ESCALATED: " if self.event == "escalation" else ""
        return clean(f"{head}{who} {what.get(self.item_kind, 'waits:')} {self.summary}", 300)

    def chat_payload(self) -> dict[str, Any]:
        """The chat incoming-webhook shape (`shape="chat"`): `text` and `blocks`.

        Slack's incoming webhooks take it as it is (Mattermost and others read `text`).
        Everything a model or a tool wrote is escaped for the chat's markup (`&`, `<`, `>`),
        so it cannot turn into a link or a mention.
        """
        def esc(text: str) -> str:
            return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

        lines = [f"*{esc(self.text())}*", f"Tool: `{esc(self.tool or '?')}`",
                 f"Why: {esc(self.reason)}"]
        lines += [f":warning: {esc(t)}" for t in self.taint]
        if self.approvals_needed > 1:
            lines.append(f"Approvals: {self.approvals_so_far} of {self.approvals_needed}")
        if self.deadline is not None:
            stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.deadline))
            lines.append(f"{(self.on_expiry or 'deny').capitalize()} by default at {stamp}")
        blocks: list[dict[str, Any]] = [
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:2900]}}]
        buttons = [(label, url, style) for label, url, style in (
            ("Approve…", self.approve_url, "primary"), ("Deny…", self.deny_url, "danger"),
            ("Open in the inbox", self.inbox_url, None)) if url]
        if buttons:
            blocks.append({"type": "actions", "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": label}, "url": url,
                 **({"style": style} if style else {})} for label, url, style in buttons]})
        return {"text": self.text(), "blocks": blocks}


@runtime_checkable
class Notifier(Protocol):
    """Where notifications go. `send` raises when the notification did not arrive.

    The `Dispatcher` retries a failed send with backoff and records every attempt; a
    notifier makes one attempt per call.
    """

    name: str
    """The target, as recorded with each attempt (never a secret: no URL path or token)."""

    async def send(self, notification: Notification) -> None:
        """Deliver `notification` once; raise on any failure."""
        ...


class WebhookNotifier:
    """POST each notification to a URL, signed (`Handrail-Signature`), as JSON.

    `shape="json"`: `Notification.to_json()`; `shape="chat"`: `text` + `blocks`, which a
    chat's incoming webhook (Slack's) posts as a message with Approve / Deny buttons. A 2xx
    answer is delivered; anything else (a 4xx/5xx, a refused connection, a timeout) raises
    `DeliveryFailed`, and the dispatcher retries it.
    """

    def __init__(self, url: str, secret: str | bytes, *, shape: Literal["json", "chat"] = "json",
                 timeout: float = 10.0, name: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        parsed = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UserError(f"WebhookNotifier needs an http(s) URL, got {url!r}")
        if shape not in ("json", "chat"):
            raise UserError(f"WebhookNotifier(shape=...) is 'json' or 'chat', not {shape!r}")
        if not (isinstance(timeout, int | float) and 0 < timeout <= 120):
            raise UserError("WebhookNotifier(timeout=...) is seconds in (0, 120]")
        self.url = url
        self._secret = _key(secret, "WebhookNotifier")
        self.shape = shape
        self.timeout = float(timeout)
        # A chat webhook's path is its secret: the record names the host only.
        self.name = name or f"webhook {parsed.scheme}://{parsed.netloc.rpartition('@')[2]}"
        self.clock = clock

    def body(self, notification: Notification) -> bytes:
        """The bytes POSTed for `notification` (what the signature covers)."""
        data = (notification.chat_payload() if self.shape == "chat"
                else notification.to_json())
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    async def send(self, notification: Notification) -> None:
        """POST once; raise `DeliveryFailed` unless the answer is 2xx."""
        import httpx

        body = self.body(notification)
        headers = {"Content-Type": "application/json",
                   SIGNATURE_HEADER: sign(self._secret, body, timestamp=int(self.clock())),
                   DELIVERY_HEADER: notification.id,
                   "User-Agent": "handrail-notify"}
        try:
            async with httpx.AsyncClient(timeout=self.timeout, follow_redirects=False,
                                         trust_env=False) as client:
                response = await client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise DeliveryFailed(f"{self.name}: {type(exc).__name__}: {exc}"[:500]) from exc
        if not 200 <= response.status_code < 300:
            raise DeliveryFailed(f"{self.name} answered {response.status_code}",
                                 status=response.status_code)


def delivery_text(note: Mapping[str, Any]) -> str | None:
    """One line for a delivery attempt the `Dispatcher` recorded; None for another note.

    `notified alice's webhook (try 2): delivered at 2026-12-02 01:02:03 UTC`, or
    `notifying ... failed (try 1: answered 503) at ...; next try at ...`.
    """
    kind = note.get("kind")
    if kind not in ("notified", "notify_failed"):
        return None
    escalation = note.get("event") == "escalation"
    to, attempt = clean(note.get("to"), 200), clean(note.get("attempt"), 20)
    if kind == "notified":
        return (f"{'escalated to' if escalation else 'notified'} {to} (try {attempt}): "
                f"delivered at {_utc(note.get('at'))}")
    status = note.get("status")
    if note.get("outcome") == "refused" and isinstance(status, int):
        why = f"answered {status}"
    else:
        why = clean(note.get("error"), 200)
        why = why.removeprefix(f"{to}: ")  # a webhook's error names its target: once is enough
    text = (f"{'escalating to' if escalation else 'notifying'} {to} failed (try {attempt}: "
            f"{why}) at {_utc(note.get('at'))}")
    if isinstance(note.get("next_try"), int | float):
        text += f"; next try at {_utc(note.get('next_try'))}"
    return text


def _utc(at: object) -> str:
    seconds = float(at) if isinstance(at, int | float) and math.isfinite(at) else 0.0
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(max(0.0, min(seconds, 2e10))))


def default_backoff(attempt: int) -> float:
    """Seconds before retry `attempt` (1, 2, ...): 1, 2, 4, ... capped at 5 minutes."""
    return float(min(2 ** (attempt - 1), 300))


@dataclass(frozen=True, slots=True)
class LinkClaim:
    """What a checked decision link says."""

    item_id: str
    """The item it decides."""
    action: Literal["approve", "deny"]
    """What it proposes."""
    expires: float
    """Until when it works (Unix time)."""
    nonce: str
    """Its one-time id (recorded in the item's notes when it is used)."""
    to: str
    """Whom it was sent to (the notifier's target), recorded with the decision."""


class DecisionLinks:
    """Signed, expiring, one-time approve / deny links into the inbox's confirmation page.

    A link is `<base_url>/links/<token>`; the token is the claim (item, action, expiry, a
    nonce, the recipient) and its HMAC-SHA256 under `key`. Opening it shows what would be
    decided and a button; only the button's POST decides (a chat's link preview, a mail
    scanner that follows links, decide nothing). The inbox refuses a forged token, an
    expired one, and one already used (its nonce is in the item's notes, or the item is
    decided). The key must be the inbox's (`handrail inbox --link-key-file`), and is not
    the webhook's secret: a receiver that can verify deliveries cannot mint links.
    """

    def __init__(self, key: str | bytes, *, base_url: str, ttl: float = 86400.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._key = _key(key, "DecisionLinks")
        parsed = urllib.parse.urlsplit(base_url) if isinstance(base_url, str) else None
        if parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UserError(f"DecisionLinks needs the inbox's http(s) address, got "
                            f"{base_url!r}")
        if not (isinstance(ttl, int | float) and math.isfinite(ttl) and 0 < ttl <= 30 * 86400):
            raise UserError("DecisionLinks(ttl=...) is seconds in (0, 30 days]")
        self.base_url = base_url.rstrip("/")
        self.ttl = float(ttl)
        self.clock = clock

    def item_url(self, item_id: str) -> str:
        """The item's page in the inbox."""
        return f"{self.base_url}/items/{urllib.parse.quote(item_id, safe='')}"

    def make(self, item_id: str, action: Literal["approve", "deny"], *, to: str,
             expires: float | None = None) -> str:
        """A link proposing `action` on `item_id`, for `to`, valid until `expires`."""
        if action not in ("approve", "deny"):
            raise UserError(f"a decision link approves or denies, not {action!r}")
        until = self.clock() + self.ttl if expires is None else expires
        claim = {"i": item_id, "a": action, "e": int(until), "n": os.urandom(12).hex(),
                 "to": to[:200]}
        body = _b64(json.dumps(claim, separators=(",", ":")).encode())
        mac = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        return f"{self.base_url}/links/{body}.{mac}"

    def check(self, token: str) -> LinkClaim:
        """The claim of a token taken from a link, once its signature and expiry hold.

        Whether it was used already is the inbox's to check (against the item).

        Raises:
            SignatureInvalid: malformed, forged, or expired.
        """
        if not isinstance(token, str) or len(token) > MAX_TOKEN or token.count(".") != 1:
            raise SignatureInvalid("not a decision link")
        body, mac = token.split(".")
        expected = _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())
        if not hmac.compare_digest(expected, mac):
            raise SignatureInvalid("this decision link is not one the inbox made (its "
                                   "signature does not match)")
        try:
            claim = json.loads(_unb64(body))
            item_id, action, until = str(claim["i"]), claim["a"], float(claim["e"])
            nonce, to = str(claim["n"]), str(claim.get("to", ""))
        except (ValueError, KeyError, TypeError) as exc:
            raise SignatureInvalid(f"a malformed decision link ({exc})") from None
        if action not in ("approve", "deny"):
            raise SignatureInvalid("a malformed decision link (action)")
        if self.clock() > until:
            raise SignatureInvalid("this decision link has expired: open the item in the "
                                   "inbox instead")
        return LinkClaim(item_id, action, until, nonce, to)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
