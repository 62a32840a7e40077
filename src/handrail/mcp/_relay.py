"""What `handrail serve` hands down to an upstream call: the client request it serves.

An upstream MCP server may, during a `tools/call`, report progress, log, ask the client's model
(`sampling/createMessage`) or its user (`elicitation/create`). Those belong to the one request
of the gateway's own client that caused the call, so the gateway's `tools/call` handler sets
`RELAY` (a context variable: the gate drives the tool body in the handler's task, and the
toolset's request task inherits it) and `MCPToolset.call_remote` reads it there. Outside
`handrail serve` (an agent's call) it is None and nothing is relayed.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["RELAY", "Relay"]

LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")


class Relay:
    """One gateway client request, as an upstream call sees it.

    Args:
        ctx: The SDK's request context of the gateway's handler (its session is the client).
        record: Keeps an event in the client's run (`GatewaySession.call_event`).
    """

    def __init__(self, ctx: Any,
                 record: Callable[..., Awaitable[None]] | None = None) -> None:
        self.ctx = ctx
        self._record = record

    def declares(self, capability: str) -> bool:
        """Whether the client declared `capability` (`sampling`, `elicitation`), and can be asked.

        A stateless-era client (2026-07-28) has no channel for a request of the server's
        during a call, so it is not relayed to.
        """
        session = self.ctx.session
        caps = getattr(session, "client_capabilities", None)
        if getattr(caps, capability, None) is None:
            return False
        connection = getattr(session, "_connection", None)
        return bool(getattr(session, "can_send_request", False)
                    or getattr(connection, "has_standalone_channel", False))

    async def record(self, kind: str, **detail: Any) -> None:
        """Keep an event in the client's run (with the turn being written)."""
        if self._record is not None:
            await self._record(kind, True, at=time.time(), **detail)

    async def progress(self, progress: float, total: float | None, message: str | None) -> None:
        """Progress for the client's own request (nothing when it gave no token)."""
        await self.ctx.session.report_progress(progress, total, message)

    async def log(self, level: str, data: Any, logger: str | None) -> None:
        """A log message of the upstream, to the client as its request's."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # logging is deprecated at 2026-07-28, still spoken
            await self.ctx.session.send_log_message(level, data, logger,
                                                    related_request_id=self.ctx.request_id)

    def _metadata(self) -> Any:
        """The request's own channel where it has one, else the connection's.

        Streamable HTTP: the POST's stream; stdio, an in-process client: the connection.
        """
        from mcp.shared.message import ServerMessageMetadata

        if getattr(self.ctx.session, "can_send_request", True):
            return ServerMessageMetadata(related_request_id=self.ctx.request_id)
        return None

    async def sample(self, params: Any) -> Any:
        """Put an upstream's `sampling/createMessage` to the client's model; its result."""
        import mcp_types as t

        return await self.ctx.session.send_request(
            t.CreateMessageRequest(params=params), t.CreateMessageResult,
            metadata=self._metadata())

    async def elicit(self, params: Any) -> Any:
        """Put an upstream's form (`elicitation/create`) to the client's user; its result."""
        import mcp_types as t

        return await self.ctx.session.send_request(
            t.ElicitRequest(params=params), t.ElicitResult, metadata=self._metadata())


RELAY: contextvars.ContextVar[Relay | None] = contextvars.ContextVar("handrail_mcp_relay",
                                                                     default=None)
"""The gateway client request the current upstream call serves, if any."""
