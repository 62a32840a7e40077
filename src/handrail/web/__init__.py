"""The approvals inbox: a web page where people see and decide what agents wait on.

`handrail inbox` serves it (extra `handrail[web]`: Starlette, uvicorn, Jinja2); see
docs/inbox.md. `Dispatcher` (no web dependency) sends notifications of pending items and
enforces their deadlines (docs/notify.md). `InboxApprover` (no web dependency) lets a
long-lived process wait for the inbox's decision in-process. `create_app` builds the ASGI
application itself, for tests and for hosting it another way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from handrail.web._approver import InboxApprover
from handrail.web._dispatch import Dispatcher, notification_of

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from handrail.approval import DecisionLinks
    from handrail.runs import Agent
    from handrail.store import RunRecord, Store

__all__ = ["Dispatcher", "InboxApprover", "create_app", "notification_of"]


def create_app(store: Store, *, agent_for: Callable[[RunRecord], Agent | None],
               login_tokens: tuple[str, ...] = (),
               reusable_tokens: tuple[str, ...] = (), default_user: str | None = None,
               poll_seconds: float = 1.5, resume_runs: bool | None = None,
               links: DecisionLinks | None = None, dispatcher: Dispatcher | None = None,
               ) -> Starlette:
    """The inbox as an ASGI application (needs `handrail[web]`).

    Args:
        store: The run store.
        agent_for: `fn(run) -> Agent | None`: rebuilds the agent that continues a run.
        login_tokens: One-time login tokens (each opens one session).
        reusable_tokens: Tokens that keep working (a team's shared `--token-file`).
        default_user: The name the login form proposes.
        poll_seconds: How often the page looks for changes.
        resume_runs: Whether a decision continues its run in this process. None (the
            default): yes, unless `handrail worker` processes serve the store (PostgreSQL):
            then the decision is recorded and a worker continues the run.
        links: Checks the decision links of notifications (`/links/TOKEN`, docs/notify.md);
            None: such links are refused.
        dispatcher: Runs beside the app while it serves (sends notifications, enforces
            deadlines); None: none.

    Raises:
        UserError: the web extra is not installed.
    """
    from handrail.errors import UserError

    try:
        from handrail.web._app import create_app as build
        from handrail.web._auth import Sessions
    except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
        raise UserError(f"the inbox needs the web extra: pip install 'handrail[web]' ({exc})"
                        ) from exc
    sessions = Sessions(one_time=set(login_tokens), reusable=set(reusable_tokens))
    return build(store, sessions=sessions, agent_for=agent_for, default_user=default_user,
                 poll_seconds=poll_seconds, resume_runs=resume_runs, links=links,
                 dispatcher=dispatcher)
