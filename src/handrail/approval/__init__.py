"""Humans in the loop: stage 6 of the gate, and questions about intent.

Approvals: only an action the policy says to ASK about reaches an `Approver`, as a `Request`
carrying everything needed to decide (a write carries its bytes). The approver returns a
`Decision`: `Approve` (optionally with modified arguments, which the gate re-validates and
re-checks, and rules to remember for the run, which never beat a deny), `Deny` (its reason
reaches the model as the call's error result) or `Defer` (the run pauses, the request is
persisted).

Questions: a tool's `ctx.ask(Question(...))` under an agent goes to a `Responder`, which
returns the answer or None ("nobody here can answer": the run pauses as AwaitingAnswer).
"""

from handrail.approval._approvers import (
    ApproveAll,
    Approver,
    CallbackApprover,
    DenyAll,
    StdinApprover,
)
from handrail.approval._control import (
    CallableControl,
    CommandControl,
    Control,
    ControlVerdict,
    adjudicate,
    control_from,
    kill_running_controls,
)
from handrail.approval._decision import Approve, Decision, Defer, Deny
from handrail.approval._notify import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    DecisionLinks,
    LinkClaim,
    Notification,
    Notifier,
    WebhookNotifier,
    WebhookVerifier,
    clean,
    default_backoff,
    sign,
    verify_signature,
)
from handrail.approval._request import Request
from handrail.approval._responders import (
    FixedResponder,
    Responder,
    ResponderNone,
    StdinResponder,
)
from handrail.tools import Question

__all__ = [
    "DELIVERY_HEADER",
    "SIGNATURE_HEADER",
    "Approve",
    "ApproveAll",
    "Approver",
    "CallableControl",
    "CallbackApprover",
    "CommandControl",
    "Control",
    "ControlVerdict",
    "Decision",
    "DecisionLinks",
    "Defer",
    "Deny",
    "DenyAll",
    "FixedResponder",
    "LinkClaim",
    "Notification",
    "Notifier",
    "Question",
    "Request",
    "Responder",
    "ResponderNone",
    "StdinApprover",
    "StdinResponder",
    "WebhookNotifier",
    "WebhookVerifier",
    "adjudicate",
    "clean",
    "control_from",
    "default_backoff",
    "kill_running_controls",
    "sign",
    "verify_signature",
]
