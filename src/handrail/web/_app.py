"""The inbox web application (Starlette): pages, the JSON the page polls, their security.

Every page and API needs a session (see `_auth`); without one a page redirects to the login
page and an API answers 401, revealing nothing. Every POST needs the session's CSRF token.
Every response carries a strict Content-Security-Policy (scripts and styles from this app
only, no inline script, no framing). Templates autoescape everything; what a model or a tool
wrote reaches the page only as text.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import anyio
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.datastructures import FormData, UploadFile
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from handrail.approval import DecisionLinks, LinkClaim
from handrail.errors import NotFound, SignatureInvalid
from handrail.store import PendingItem, Store
from handrail.web._auth import COOKIE, Session, Sessions, clean_user, csrf_ok
from handrail.web._dispatch import Dispatcher
from handrail.web._inbox import PAGE_SIZE, AgentFor, Filters, Inbox, Refused

__all__ = ["SECURITY_HEADERS", "create_app"]

HERE = Path(__file__).parent

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

SECURITY_HEADERS: dict[str, str] = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
"""Sent with every response."""

MAX_FORM_BYTES = 1 << 20
MAX_BULK = 40
"""The most approvals one bulk decision takes (a form holds at most 50 fields)."""

AGES = {"": None, "1m": 60.0, "10m": 600.0, "1h": 3600.0, "1d": 86400.0}
"""The age filter's choices: older than ..."""


class _SecurityHeaders:
    """Adds `SECURITY_HEADERS` (and no-store for dynamic responses) to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", [])
                           if k.decode("latin-1").lower() not in SECURITY_HEADERS]
                headers += [(k.encode(), v.encode()) for k, v in SECURITY_HEADERS.items()]
                if not static:
                    headers.append((b"cache-control", b"no-store"))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _fmt_time(ts: float | None) -> str:
    if not ts:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def _ago(ts: float | None) -> str:
    if not ts:
        return "-"
    delta = max(0.0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if delta >= size:
            return f"{int(delta // size)}{unit} ago"
    return f"{int(delta)}s ago"


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["when"] = _fmt_time
    env.filters["ago"] = _ago
    env.filters["pretty"] = lambda v: json.dumps(v, indent=2, ensure_ascii=False,
                                                 sort_keys=True, default=str)
    return env


def create_app(store: Store, *, sessions: Sessions, agent_for: AgentFor,
               default_user: str | None = None, poll_seconds: float = 1.5,
               resume_runs: bool | None = None,
               links: DecisionLinks | None = None,
               dispatcher: Dispatcher | None = None) -> Starlette:
    """The inbox as an ASGI application.

    Args:
        store: The run store.
        sessions: The login tokens and sessions (`handrail inbox` prints one token).
        agent_for: Rebuilds a run's agent (to continue it), or returns None.
        default_user: The name the login form proposes (`--user`).
        poll_seconds: How often the page looks for changes.
        resume_runs: Whether a decision continues its run in this process; None: unless
            `handrail worker` processes serve the store (PostgreSQL).
        links: The key that checks decision links (`/links/TOKEN`); None: links refused.
        dispatcher: Runs while the app serves (notifications, deadlines); None: none.
    """
    inbox = Inbox(store, agent_for, resume_runs=resume_runs)
    env = _templates()
    flashes: dict[str, tuple[str, str]] = {}

    def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        session: Session | None = request.scope.get("session_obj")
        # Only a whole page shows (and so consumes) the message a decision left; a fragment
        # the page polls for must not swallow it.
        whole_page = not name.startswith("_")
        flash = flashes.pop(session.id, None) if session and whole_page else None
        html = env.get_template(name).render(
            session=session, csrf=session.csrf if session else "",
            poll_ms=int(poll_seconds * 1000), flash=flash, **context)
        return HTMLResponse(html, status_code=status)

    def guarded(fn: Callable[[Request, Session], Awaitable[Response]], *, api: bool = False,
                post: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            session = sessions.from_cookie(request.cookies.get(COOKIE))
            if session is None:
                if api or post:
                    return JSONResponse({"error": "login required"}, status_code=401)
                return RedirectResponse("/login", status_code=303)
            request.scope["session_obj"] = session
            if post:
                # Defence in depth beside SameSite=Strict and the token: a browser says when a
                # request comes from another site.
                if request.headers.get("sec-fetch-site", "same-origin") not in (
                        "same-origin", "none"):
                    return JSONResponse({"error": "cross-site request refused"},
                                        status_code=403)
                form = await _form(request)
                if form is None:
                    return JSONResponse({"error": "send a url-encoded form of at most 1 MiB"},
                                        status_code=413)
                sent = request.headers.get("x-csrf-token") or form.get("csrf")
                if not csrf_ok(session, sent if isinstance(sent, str) else None):
                    return JSONResponse({"error": "missing or wrong CSRF token; reload the "
                                                  "page"}, status_code=403)
                request.scope["form_obj"] = form
            return await fn(request, session)

        return endpoint

    # ------------------------------------------------------------ login

    async def login_page(request: Request) -> Response:
        token = request.query_params.get("token", "")
        return render(request, "login.html", token=token[:200], user=default_user or "",
                      error=None)

    async def login(request: Request) -> Response:
        form = await _form(request)
        if form is None:
            return JSONResponse({"error": "send a url-encoded form of at most 1 MiB"},
                                status_code=413)
        token = str(form.get("token") or "")
        user = clean_user(str(form.get("user") or default_user or ""))
        session = sessions.login(token, user) if user else None
        if session is None:
            return render(request, "login.html", status=401, token="", user=user,
                          error="That login link is not valid (each printed link works "
                                "once), or the name is empty.")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, sessions.cookie_value(session), httponly=True,
                            samesite="strict", secure=request.url.scheme == "https",
                            max_age=int(sessions.lifetime), path="/")
        return response

    async def logout(request: Request, session: Session) -> Response:
        sessions.logout(session)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return response

    # ------------------------------------------------------------- list

    def filters_of(request: Request) -> tuple[Filters, dict[str, str]]:
        q = request.query_params
        raw = {k: q.get(k, "")[:200] for k in ("agent", "tool", "kind", "age")}
        kind = raw["kind"] if raw["kind"] in ("approval", "question", "recovery") else ""
        age = raw["age"] if raw["age"] in AGES else ""
        raw["kind"], raw["age"] = kind, age
        return Filters(agent=raw["agent"] or None, tool=raw["tool"] or None,
                       kind=kind or None, older_than=AGES[age]), raw

    async def list_context(request: Request) -> dict[str, Any]:
        filters, raw = filters_of(request)
        items = await inbox.items(filters)
        try:
            page = max(1, min(10_000, int(request.query_params.get("page", "1"))))
        except ValueError:
            page = 1
        pages = max(1, (len(items) + PAGE_SIZE - 1) // PAGE_SIZE)
        page = min(page, pages)
        shown = items[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
        everything = items if not any((filters.agent, filters.tool, filters.kind,
                                       filters.older_than)) else await inbox.all_open()
        agents = sorted({p.agent for p in everything if p.agent})
        tools = sorted({p.tool for p in everything if p.tool})
        version = _version(items, agents, tools)

        def page_link(n: int) -> str:
            return "/?" + urlencode({**{k: v for k, v in raw.items() if v}, "page": n})

        return {"items": shown, "total": len(items), "page": page, "pages": pages,
                "filters": raw, "agents": agents, "tools": tools, "version": version,
                "page_link": page_link, "query": urlencode({k: v for k, v in raw.items() if v}
                                                           | {"page": str(page)})}

    async def index(request: Request, session: Session) -> Response:
        return render(request, "list.html", **await list_context(request))

    async def list_fragment(request: Request, session: Session) -> Response:
        context = await list_context(request)
        etag = f'"{context["version"]}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag})
        response = render(request, "_items.html", **context)
        response.headers["etag"] = etag
        return response

    # ------------------------------------------------------------- item

    async def item_page(request: Request, session: Session, *, status: int = 200,
                        error: str | None = None, form: FormData | None = None) -> Response:
        try:
            view = await inbox.view(request.path_params["item_id"])
        except NotFound:
            return render(request, "missing.html", status=404, what="pending item")
        return render(request, "item.html", status=status, view=view, item=view.item,
                      error=error, form=form or {}, job=inbox.jobs.get(view.item.run_id))

    async def item_get(request: Request, session: Session) -> Response:
        return await item_page(request, session)

    async def item_state(request: Request, session: Session) -> Response:
        try:
            item = await store.pending_item(request.path_params["item_id"])
        except NotFound:
            return JSONResponse({"error": "no such item"}, status_code=404)
        return JSONResponse(_item_state(item))

    def decision_endpoint(action: Callable[[str, Session, FormData], Awaitable[str]]
                          ) -> Callable[[Request, Session], Awaitable[Response]]:
        async def endpoint(request: Request, session: Session) -> Response:
            item_id = request.path_params["item_id"]
            form: FormData = request.scope["form_obj"]
            try:
                message = await action(item_id, session, form)
            except Refused as exc:
                if exc.status == 404:
                    return render(request, "missing.html", status=404, what="pending item")
                return await item_page(request, session, status=exc.status,
                                       error=exc.message, form=form)
            flashes[session.id] = ("ok", message)
            return RedirectResponse(f"/items/{item_id}", status_code=303)

        return endpoint

    def field(form: FormData, name: str) -> str:
        value = form.get(name)
        return value if isinstance(value, str) else ""

    async def do_approve(item_id: str, session: Session, form: FormData) -> str:
        remember = field(form, "remember_pattern") if field(form, "remember") else None
        return await inbox.approve(item_id, session.user, remember=remember)

    async def approve_edited(request: Request, session: Session) -> Response:
        """Without `confirm`: show what the edited call would do. With it: approve that."""
        form: FormData = request.scope["form_obj"]
        if field(form, "confirm"):
            return await decision_endpoint(do_approve_edited)(request, session)
        item_id = request.path_params["item_id"]
        try:
            check = await inbox.check_edit(item_id, field(form, "arguments"))
        except Refused as exc:
            if exc.status == 404:
                return render(request, "missing.html", status=404, what="pending item")
            return await item_page(request, session, status=exc.status, error=exc.message,
                                   form=form)
        item = await store.pending_item(item_id)
        return render(request, "edit_preview.html", item=item, check=check)

    async def do_approve_edited(item_id: str, session: Session, form: FormData) -> str:
        return await inbox.approve(item_id, session.user,
                                   modified_json=field(form, "arguments"),
                                   previewed=field(form, "previewed"))

    async def do_deny(item_id: str, session: Session, form: FormData) -> str:
        return await inbox.deny(item_id, session.user, field(form, "reason"))

    async def do_answer(item_id: str, session: Session, form: FormData) -> str:
        text = field(form, "choice") or field(form, "answer")
        return await inbox.answer(item_id, session.user, text)

    async def do_recover(item_id: str, session: Session, form: FormData) -> str:
        return await inbox.recover(item_id, session.user, field(form, "choice"),
                                   field(form, "observation"))

    async def bulk(request: Request, session: Session) -> Response:
        """Several approvals decided at once: each its own compare-and-swap and record.

        One item already decided (or refused) elsewhere does not stop the others: the page
        says, item by item, what became of each.
        """
        form: FormData = request.scope["form_obj"]
        ids = list(dict.fromkeys(v for v in form.getlist("item") if isinstance(v, str)))
        action = field(form, "action")
        reason = field(form, "reason")
        error = None
        if action not in ("approve", "deny"):
            error = "choose Approve selected or Deny selected"
        elif not ids:
            error = "select at least one approval (the boxes beside the items)"
        elif len(ids) > MAX_BULK:
            error = f"at most {MAX_BULK} items at once; select fewer"
        elif action == "deny" and not reason.strip():
            error = "a denial needs a reason: the model reads it and can adapt"
        if error is not None:
            return render(request, "bulk.html", status=422, error=error, results=[],
                          action=action)
        results = []
        for item_id in ids:
            try:
                if action == "approve":
                    message = await inbox.approve(item_id, session.user)
                else:
                    message = await inbox.deny(item_id, session.user, reason)
                # A four-eyes item counts the approval and stays open: said as such.
                waits = action == "approve" and (
                    await store.pending_item(item_id)).state == "open"
                results.append({"id": item_id, "ok": True, "message": message,
                                "waits": waits})
            except Refused as exc:
                results.append({"id": item_id, "ok": False,
                                "message": "no such pending item" if exc.status == 404
                                else exc.message})
        return render(request, "bulk.html", error=None, results=results, action=action)

    # ----------------------------------------------------- decision links

    async def link_claim(request: Request) -> tuple[str, LinkClaim, PendingItem] | Response:
        """The link's claim and item, or the page that refuses it (nothing decided)."""
        token = request.path_params["token"]
        if links is None:
            return render(request, "link_refused.html", status=404,
                          reason="this inbox takes no decision links")
        try:
            claim = links.check(token)
            item = await store.pending_item(claim.item_id)
        except SignatureInvalid as exc:
            return render(request, "link_refused.html", status=403, reason=str(exc))
        except NotFound:
            return render(request, "link_refused.html", status=404,
                          reason="the item it decides is not in this store")
        if any(n.get("kind") == "link_used" and n.get("nonce") == claim.nonce
               for n in item.notes):
            return render(request, "link_refused.html", status=410,
                          reason="this link was used already: each link decides once")
        if item.state != "open":
            return render(request, "link_refused.html", status=410,
                          reason=f"the item was {_already_text(item)}")
        return token, claim, item

    async def link_get(request: Request) -> Response:
        """The confirmation page: what the link would decide, and the button. Never decides."""
        found = await link_claim(request)
        if isinstance(found, Response):
            return found
        token, claim, item = found
        return render(request, "link.html", token=token, claim=claim, item=item, person="",
                      done=False, error=None)

    async def link_post(request: Request) -> Response:
        """The button: decide as the link proposes, once, naming who decided."""
        if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return JSONResponse({"error": "cross-site request refused"}, status_code=403)
        form = await _form(request)
        if form is None:
            return JSONResponse({"error": "send a url-encoded form of at most 1 MiB"},
                                status_code=413)
        found = await link_claim(request)
        if isinstance(found, Response):
            return found
        token, claim, item = found
        session = sessions.from_cookie(request.cookies.get(COOKIE))
        name = clean_user(field(form, "name"))
        if session is not None:
            who = session.user
        elif item.approvals_needed > 1 and claim.action == "approve":
            return render(request, "link.html", status=401, token=token, claim=claim,
                          item=item, person=name, done=False,
                          error=f"this approval needs {item.approvals_needed} different "
                                "people: sign in to the inbox first (your sign-in names "
                                "you), then press the button again")
        elif not name:
            return render(request, "link.html", status=422, token=token, claim=claim,
                          item=item, person=name, done=False,
                          error="give your name: it is recorded with the decision")
        else:
            who = f"{name} (link sent to {claim.to})" if claim.to else name
        # Spent before it decides: a second press, another tab, a replay are refused.
        await store.record_notification(item.id, {
            "kind": "link_used", "nonce": claim.nonce, "action": claim.action, "by": who,
            "at": store.clock()})
        try:
            if claim.action == "approve":
                message = await inbox.approve(item.id, who)
            else:
                message = await inbox.deny(item.id, who, field(form, "reason"))
        except Refused as exc:
            return render(request, "link.html", status=exc.status, token=token, claim=claim,
                          item=item, person=name, done=True, ok=False, message=exc.message)
        return render(request, "link.html", token=token, claim=claim, item=item, person=name,
                      done=True, ok=True, message=message)

    # -------------------------------------------------------------- run

    async def run_context(request: Request) -> dict[str, Any] | None:
        try:
            run, timeline = await inbox.run_view(request.path_params["run_id"])
        except NotFound:
            return None
        pending = [p for p in await store.pending() if p.run_id == run.id]
        digest = hashlib.sha256(json.dumps([run.status.value, run.updated_at, len(timeline),
                                            [p.id for p in pending],
                                            _job_key(inbox, run.id)]).encode()).hexdigest()[:16]
        return {"run": run, "timeline": timeline, "pending": pending,
                "job": inbox.jobs.get(run.id), "version": digest}

    async def run_page(request: Request, session: Session) -> Response:
        context = await run_context(request)
        if context is None:
            return render(request, "missing.html", status=404, what="run")
        return render(request, "run.html", **context)

    async def run_fragment(request: Request, session: Session) -> Response:
        context = await run_context(request)
        if context is None:
            return JSONResponse({"error": "no such run"}, status_code=404)
        etag = f'"{context["version"]}"'
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers={"etag": etag})
        response = render(request, "_run.html", **context)
        response.headers["etag"] = etag
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            inbox.task_group = tg
            if dispatcher is not None:
                tg.start_soon(dispatcher.run)
            try:
                yield
            finally:
                inbox.task_group = None
                tg.cancel_scope.cancel()

    def post(fn: Callable[[Request, Session], Awaitable[Response]]
             ) -> Callable[[Request], Awaitable[Response]]:
        return guarded(fn, post=True)

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", post(logout), methods=["POST"]),
        Route("/", guarded(index)),
        Route("/fragments/items", guarded(list_fragment, api=True)),
        Route("/items/bulk", post(bulk), methods=["POST"]),
        Route("/items/{item_id}", guarded(item_get)),
        Route("/api/items/{item_id}", guarded(item_state, api=True)),
        Route("/items/{item_id}/approve", post(decision_endpoint(do_approve)),
              methods=["POST"]),
        Route("/items/{item_id}/approve-edited", post(approve_edited), methods=["POST"]),
        Route("/items/{item_id}/deny", post(decision_endpoint(do_deny)), methods=["POST"]),
        Route("/items/{item_id}/answer", post(decision_endpoint(do_answer)), methods=["POST"]),
        Route("/items/{item_id}/recover", post(decision_endpoint(do_recover)),
              methods=["POST"]),
        Route("/links/{token}", link_get, methods=["GET"]),
        Route("/links/{token}", link_post, methods=["POST"]),
        Route("/runs/{run_id}", guarded(run_page)),
        Route("/fragments/runs/{run_id}", guarded(run_fragment, api=True)),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.add_middleware(_SecurityHeaders)
    app.state.inbox = inbox
    return app


async def _form(request: Request) -> FormData | None:
    """The request's url-encoded form, or None when it is too large or of another type.

    Only `application/x-www-form-urlencoded` (what the page's forms send) is read, so no
    multipart parser meets what a client sent. A body of unknown length is refused: browsers
    always send Content-Length for a form.
    """
    length = request.headers.get("content-length")
    if length is None or not length.isdigit() or int(length) > MAX_FORM_BYTES:
        return None
    if int(length) == 0:
        return FormData()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    try:
        pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=50,
                          errors="strict")
    except (UnicodeDecodeError, ValueError):
        return None
    fields: list[tuple[str, str | UploadFile]] = list(pairs)
    return FormData(fields)


def _version(items: list[PendingItem], *suggestions: list[str]) -> str:
    """What the list shows, as a short digest (the fragment's ETag)."""
    digest = hashlib.sha256()
    # An item's approvals so far are part of what shows ("1 of 2").
    for text in [f"{p.id}:{len(p.approvals)}" for p in items] + [
            t for group in suggestions for t in ("\1", *group)]:
        digest.update(text.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _already_text(item: PendingItem) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(item.decided_at or 0))
    return f"already decided by {item.decided_by or 'someone'} at {when}"


def _job_key(inbox: Inbox, run_id: str) -> str:
    job = inbox.jobs.get(run_id)
    return "" if job is None else f"{job.state}:{job.message}"


def _item_state(item: PendingItem) -> dict[str, Any]:
    return {"id": item.id, "kind": item.kind, "state": item.state,
            "decided_by": item.decided_by, "decided_at": _fmt_time(item.decided_at),
            "decision": (item.decision or {}).get("kind") if item.kind == "approval" else None,
            "run_id": item.run_id}
