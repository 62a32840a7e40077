"""`handrail inbox`: serve the approvals inbox (needs the `handrail[web]` extra).

It prints one URL with a one-time login token; the token becomes a session cookie. It binds to
127.0.0.1; any other address needs `--token-file` (the team's login token, kept out of shell
history and process lists) or an explicit `--allow-remote`, because whoever reaches the page
with a token can make agents write files and run programs. Put TLS in front of it before
exposing it beyond one machine.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from handrail.cli._runs import _agent_for, _store_path, add_store_option
from handrail.errors import UserError

if TYPE_CHECKING:
    import socket

    from handrail.store import RunRecord

# What serving needs (sockets, tokens, the store) is imported when `inbox` runs: every other
# command builds this parser too, and pays its imports (issue 11).

__all__ = ["register"]


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    import ipaddress

    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _read_token_file(path: str) -> str:
    from handrail.cli._token_file import read_token_file

    return read_token_file(path)


def _bind(host: str, port: int) -> socket.socket:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _cmd_inbox(args: argparse.Namespace) -> int:
    import secrets

    import anyio

    from handrail.store import Store
    from handrail.store.contract import redacted_url

    try:
        import uvicorn

        from handrail.web import create_app
    except ModuleNotFoundError as exc:
        raise UserError(f"`handrail inbox` needs the web extra: pip install 'handrail[web]' "
                        f"({exc.name} is missing)") from None
    host = args.host
    if not _is_loopback(host) and not (args.token_file or args.allow_remote):
        raise UserError(f"--host {host} is reachable from other machines: pass --token-file "
                        "FILE (a login token you hand out) or --allow-remote to do it anyway")
    url_store = _store_path(args)
    if "://" not in url_store and not os.path.exists(url_store):
        raise UserError(f"no run store at {url_store!r}: pass --store (or set HANDRAIL_STORE)")
    reusable = (_read_token_file(args.token_file),) if args.token_file else ()
    one_time = secrets.token_urlsafe(24)
    user = args.user or _default_user()

    def agent_for(run: RunRecord) -> Any:
        return _agent_for(argparse.Namespace(agent=args.agent), run)

    links, notifier, escalate_to = _notify_options(args)

    async def serve() -> int:
        store = Store.open(url_store)
        try:
            from handrail.web import Dispatcher

            dispatcher = None if notifier is None else Dispatcher(
                store, notifier, escalate_to=escalate_to, links=links,
                inbox_url=args.public_url)
            app = create_app(store, agent_for=agent_for, login_tokens=(one_time,),
                             reusable_tokens=reusable, default_user=user,
                             resume_runs=args.resume, links=links, dispatcher=dispatcher)
            sock = _bind(host, args.port)
            port = sock.getsockname()[1]
            shown = f"[{host}]" if ":" in host else host
            print(f"handrail inbox for {redacted_url(url_store)}", flush=True)
            if notifier is not None:
                print(f"notifying {notifier.name} of every pending item"
                      + (f", escalations to {escalate_to.name}" if escalate_to else "")
                      + ("; with decision links" if links else ""), flush=True)
            if not app.state.inbox.resume_runs:
                print("decided runs are left to `handrail worker` (--resume: continue them "
                      "here)", flush=True)
            print(f"open http://{shown}:{port}/login?token={one_time}", flush=True)
            if reusable:
                print("(that link signs in once; anyone else signs in with the token from the "
                      "token file)", flush=True)
            else:
                print("(that link signs in once, in one browser: for a second person or "
                      "browser, start the inbox with --token-file FILE, a token that keeps "
                      "working)", flush=True)
            config = uvicorn.Config(app, log_level=args.log_level, access_log=False,
                                    lifespan="on", server_header=False)
            server = uvicorn.Server(config)
            await server.serve(sockets=[sock])
            return 0
        finally:
            await store.close()

    try:
        return anyio.run(serve)
    except KeyboardInterrupt:
        return 0


def _notify_options(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The decision links, the notifier and the escalation target `--notify-*` ask for."""
    from handrail.approval import DecisionLinks, WebhookNotifier
    from handrail.cli._token_file import read_token_file

    if (args.escalate_url or args.link_key_file) and not args.notify_url:
        raise UserError("--escalate-url and --link-key-file go with --notify-url URL (where "
                        "the notifications go)")
    if not args.notify_url:
        return None, None, None
    if not args.notify_secret_file:
        raise UserError("--notify-url needs --notify-secret-file FILE: the secret each "
                        "delivery is signed with (at least 16 characters; the receiver "
                        "verifies it with hr.approval.WebhookVerifier)")
    secret = read_token_file(args.notify_secret_file, option="--notify-secret-file")
    links = None
    if args.link_key_file:
        if not args.public_url:
            raise UserError("--link-key-file needs --public-url URL: the inbox's address as "
                            "the people who click the links reach it")
        links = DecisionLinks(read_token_file(args.link_key_file, option="--link-key-file"),
                              base_url=args.public_url)
    notifier = WebhookNotifier(args.notify_url, secret, shape=args.notify_shape)
    escalate = None if not args.escalate_url else WebhookNotifier(
        args.escalate_url, secret, shape=args.notify_shape)
    return links, notifier, escalate


def _default_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return ""


def register(sub: Any) -> None:
    """Add `handrail inbox` to the `handrail` parser."""
    text = "serve the approvals inbox: a web page to decide what agents wait on"
    p: argparse.ArgumentParser = sub.add_parser("inbox", help=text, description=text)
    add_store_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                                                        "127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks one)")
    p.add_argument("--user", help="the name proposed at login, recorded with decisions "
                                  "(default: your login name)")
    p.add_argument("--token-file", help="a file holding a login token that keeps working "
                                        "(needed for a non-loopback --host)")
    p.add_argument("--allow-remote", action="store_true",
                   help="listen on a non-loopback --host without a token file")
    p.add_argument("--agent", metavar="MODULE:OBJECT",
                   help="the agent that continues runs (default: the one each run recorded)")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                   help="continue a run in this process once it is decided (default: yes, "
                        "except on a PostgreSQL store, whose `handrail worker`s continue it)")
    p.add_argument("--notify-url", metavar="URL",
                   help="POST each new pending item (and each escalation) here, signed; "
                        "see docs/notify.md")
    p.add_argument("--notify-secret-file", metavar="FILE",
                   help="the secret deliveries are signed with (HMAC-SHA256)")
    p.add_argument("--notify-shape", choices=["json", "chat"], default="json",
                   help="json: handrail's payload; chat: text + blocks, for a chat's "
                        "incoming webhook (default json)")
    p.add_argument("--escalate-url", metavar="URL",
                   help="where an item past its rule's `escalate` time is notified again")
    p.add_argument("--link-key-file", metavar="FILE",
                   help="a key for one-time approve/deny links in notifications (not the "
                        "notify secret)")
    p.add_argument("--public-url", metavar="URL",
                   help="the inbox's address as people reach it, for links in notifications")
    p.add_argument("--log-level", default="warning",
                   choices=["critical", "error", "warning", "info", "debug"],
                   help="the web server's log level (default: warning)")
    # A long-running server of many runs: the collector is tuned for it (cli.main).
    p.set_defaults(func=_cmd_inbox, many_runs=True)
