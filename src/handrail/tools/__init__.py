"""Declaring tools and running one call: the tool core (stages 1, 3, 7 and 8 of the gate).

Names load from their module on first use (PEP 562): the policy, the store and the CLI's
reading commands take `Act` or `canonicalize` from here without loading pydantic, which only
the modules that build a typed tool (`_tool`, `_content`, `_paths`, ...) import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from handrail.tools._actions import Act, Action
    from handrail.tools._content import (
        Audio,
        Content,
        EmbeddedResource,
        Image,
        Json,
        ResourceLink,
        Text,
        ToolResult,
        slot_setter,
    )
    from handrail.tools._context import CallContext, Elicitation, Question
    from handrail.tools._decorator import tool
    from handrail.tools._handler import (
        DEFAULT_MAX_ARGUMENT_BYTES,
        HandlerState,
        ToolHandler,
        ToolImpl,
        check_argument_payload,
        issues_from_validation_error,
        raise_body_error,
    )
    from handrail.tools._names import DEFAULT_SERVER, ToolId, ToolName
    from handrail.tools._paths import (
        PATH_LIKE_NAMES,
        ExecArgv,
        PathChanged,
        ReadPath,
        UnguardedArgumentWarning,
        Url,
        WritePath,
        bind_arguments,
        decided_paths,
        scrub_host_paths,
        unguarded_path_arguments,
        unguarded_problems,
    )
    from handrail.tools._plan import Plan, Step
    from handrail.tools._schemas import local_validator, schema_issues
    from handrail.tools._spec import ToolSpec
    from handrail.tools._steps import (
        Cancel,
        CancelInteraction,
        Decline,
        Finished,
        Interaction,
        Invoke,
        Respond,
        Submit,
    )
    from handrail.tools._tagged import TaggedUnion
    from handrail.tools._taint import (
        MIN_SUBSTRING,
        Provenance,
        Quote,
        Taint,
        address_pointers,
        call_words,
        link_pointers,
        pointer_values,
    )
    from handrail.tools._tool import FunctionTool, Tool
    from handrail.tools._toolbox import SchemaTool, Toolbox, Toolset, as_impl
    from handrail.tools._watched import WatchedAnswers
    from handrail.tools._workspace import (
        PATH_MAX,
        OutsideWorkspace,
        UncanonicalPath,
        UncanonicalTarget,
        canonical_path,
        canonicalize,
        resolve_in_workspace,
        workspace_root,
    )

_LAZY: dict[str, str] = {
    "Act": "handrail.tools._actions",
    "Action": "handrail.tools._actions",
    "Audio": "handrail.tools._content",
    "CallContext": "handrail.tools._context",
    "Cancel": "handrail.tools._steps",
    "CancelInteraction": "handrail.tools._steps",
    "Content": "handrail.tools._content",
    "DEFAULT_MAX_ARGUMENT_BYTES": "handrail.tools._handler",
    "DEFAULT_SERVER": "handrail.tools._names",
    "Decline": "handrail.tools._steps",
    "Elicitation": "handrail.tools._context",
    "EmbeddedResource": "handrail.tools._content",
    "ExecArgv": "handrail.tools._paths",
    "Finished": "handrail.tools._steps",
    "FunctionTool": "handrail.tools._tool",
    "HandlerState": "handrail.tools._handler",
    "Image": "handrail.tools._content",
    "Interaction": "handrail.tools._steps",
    "Invoke": "handrail.tools._steps",
    "Json": "handrail.tools._content",
    "MIN_SUBSTRING": "handrail.tools._taint",
    "OutsideWorkspace": "handrail.tools._workspace",
    "PATH_LIKE_NAMES": "handrail.tools._paths",
    "PATH_MAX": "handrail.tools._workspace",
    "PathChanged": "handrail.tools._paths",
    "Plan": "handrail.tools._plan",
    "Provenance": "handrail.tools._taint",
    "Quote": "handrail.tools._taint",
    "local_validator": "handrail.tools._schemas",
    "schema_issues": "handrail.tools._schemas",
    "Question": "handrail.tools._context",
    "ReadPath": "handrail.tools._paths",
    "ResourceLink": "handrail.tools._content",
    "Respond": "handrail.tools._steps",
    "SchemaTool": "handrail.tools._toolbox",
    "Step": "handrail.tools._plan",
    "Submit": "handrail.tools._steps",
    "TaggedUnion": "handrail.tools._tagged",
    "Taint": "handrail.tools._taint",
    "Text": "handrail.tools._content",
    "Tool": "handrail.tools._tool",
    "ToolHandler": "handrail.tools._handler",
    "ToolId": "handrail.tools._names",
    "ToolImpl": "handrail.tools._handler",
    "ToolName": "handrail.tools._names",
    "ToolResult": "handrail.tools._content",
    "ToolSpec": "handrail.tools._spec",
    "Toolbox": "handrail.tools._toolbox",
    "Toolset": "handrail.tools._toolbox",
    "UncanonicalPath": "handrail.tools._workspace",
    "UncanonicalTarget": "handrail.tools._workspace",
    "UnguardedArgumentWarning": "handrail.tools._paths",
    "WatchedAnswers": "handrail.tools._watched",
    "Url": "handrail.tools._paths",
    "WritePath": "handrail.tools._paths",
    "as_impl": "handrail.tools._toolbox",
    "bind_arguments": "handrail.tools._paths",
    "canonical_path": "handrail.tools._workspace",
    "canonicalize": "handrail.tools._workspace",
    "check_argument_payload": "handrail.tools._handler",
    "decided_paths": "handrail.tools._paths",
    "issues_from_validation_error": "handrail.tools._handler",
    "pointer_values": "handrail.tools._taint",
    "address_pointers": "handrail.tools._taint",
    "call_words": "handrail.tools._taint",
    "link_pointers": "handrail.tools._taint",
    "raise_body_error": "handrail.tools._handler",
    "resolve_in_workspace": "handrail.tools._workspace",
    "scrub_host_paths": "handrail.tools._paths",
    "slot_setter": "handrail.tools._content",
    "tool": "handrail.tools._decorator",
    "unguarded_path_arguments": "handrail.tools._paths",
    "unguarded_problems": "handrail.tools._paths",
    "workspace_root": "handrail.tools._workspace",
}
"""Public name -> the module that defines it."""

__all__ = [
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "DEFAULT_SERVER",
    "MIN_SUBSTRING",
    "PATH_LIKE_NAMES",
    "PATH_MAX",
    "Act",
    "Action",
    "Audio",
    "CallContext",
    "Cancel",
    "CancelInteraction",
    "Content",
    "Decline",
    "Elicitation",
    "EmbeddedResource",
    "ExecArgv",
    "Finished",
    "FunctionTool",
    "HandlerState",
    "Image",
    "Interaction",
    "Invoke",
    "Json",
    "OutsideWorkspace",
    "PathChanged",
    "Plan",
    "Provenance",
    "Question",
    "Quote",
    "ReadPath",
    "ResourceLink",
    "Respond",
    "SchemaTool",
    "Step",
    "Submit",
    "TaggedUnion",
    "Taint",
    "Text",
    "Tool",
    "ToolHandler",
    "ToolId",
    "ToolImpl",
    "ToolName",
    "ToolResult",
    "ToolSpec",
    "Toolbox",
    "Toolset",
    "UncanonicalPath",
    "UncanonicalTarget",
    "UnguardedArgumentWarning",
    "Url",
    "WatchedAnswers",
    "WritePath",
    "address_pointers",
    "as_impl",
    "bind_arguments",
    "call_words",
    "canonical_path",
    "canonicalize",
    "check_argument_payload",
    "decided_paths",
    "issues_from_validation_error",
    "link_pointers",
    "local_validator",
    "pointer_values",
    "raise_body_error",
    "resolve_in_workspace",
    "schema_issues",
    "scrub_host_paths",
    "slot_setter",
    "tool",
    "unguarded_path_arguments",
    "unguarded_problems",
    "workspace_root",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'handrail.tools' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | set(globals()))
