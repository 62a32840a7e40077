"""`handrail.__all__` is the public API: adding a name is a deliberate act."""

import handrail

EXPECTED = [
    "Act", "Action", "Agent", "AlreadyDecided", "ApprovalDenied", "Approve", "ApproveAll",
    "Approver", "AskTerms", "Audio", "AwaitingAnswer", "AwaitingApproval", "AwaitingRecovery",
    "CallCancelled", "CallContext", "CallRecord", "CallStatus", "CallbackApprover", "Cancel",
    "CancelInteraction", "Cancelled", "CommandControl", "Completed", "ConfigError", "Conversation",
    "Decision", "DecisionLinks", "Decline", "Defer", "Deferred", "DeliveryFailed", "Deny",
    "DenyAll", "Dispatcher", "Disposition", "Effect", "Elicitation", "EmbeddedResource", "ExecArgv",
    "Failed", "Finished", "FixedResponder", "Governance", "Grant", "HandlerStateError",
    "HandrailError", "Image", "InboxApprover", "InjectedTool", "Interaction", "InteractionDeclined",
    "InvalidArguments", "InvalidOutput", "Invoke", "Issue", "Json", "Layer", "Limit", "Manifest",
    "ManifestDrift", "ManifestError", "ModelError", "NotFound", "NotGranted", "NotVerified",
    "Notification", "Notifier", "PathChanged", "PendingItem", "Plan", "Policy", "PolicyDenied",
    "PolicyError", "Question", "Quote", "ReadPath", "Recovery", "Request", "ResourceLink",
    "Respond", "Responder", "ResponderNone", "ResumeRefused", "RoutedCall", "RoutedCapture", "Rule",
    "RunEvent", "RunHandle", "RunNotCompleted", "RunOutcome", "RunRecord", "RunResult", "RunStatus",
    "RunStream", "Sandbox", "SandboxUnavailable", "SchemaTool", "SignatureInvalid", "StdinApprover",
    "StdinResponder", "Step", "Store", "StoreError", "SubAgentTool", "Submit", "SubprocessTool",
    "Taint", "Telemetry", "TerminalPrinter", "Text", "Tool", "ToolError", "ToolFailed",
    "ToolHandler", "ToolId", "ToolImpl", "ToolInjection", "ToolName", "ToolResult", "ToolSpec",
    "ToolTimeout", "Toolbox", "Toolset", "TransportError", "UnguardedArgumentWarning",
    "UnknownTool", "Url", "UserError", "Verdict", "VerificationAttempt", "VerificationFailed",
    "Verified", "Verify", "VerifyContext", "WebhookNotifier", "WebhookVerifier", "WritePath",
    "__version__", "load_tool_dir", "resume", "resume_sync", "resume_with_answer",
    "resume_with_answer_sync", "resume_with_decision", "resume_with_decision_sync",
    "resume_with_recovery", "resume_with_recovery_sync", "tool",
]


def test_all_is_pinned_and_sorted() -> None:
    assert sorted(EXPECTED) == EXPECTED
    assert handrail.__all__ == EXPECTED


def test_every_exported_name_exists() -> None:
    for name in handrail.__all__:
        assert hasattr(handrail, name), name


def test_public_names_have_docstrings() -> None:
    for name in handrail.__all__:
        obj = getattr(handrail, name)
        if name.startswith("__") or not callable(obj):
            continue
        assert obj.__doc__ and obj.__doc__.strip(), f"hr.{name} has no docstring"
