"""Declaring tools and running one call: the tool core (stages 1, 3, 7 and 8 of the gate)."""

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
)
from handrail.tools._context import CallContext, Elicitation, Question
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
    unguarded_path_arguments,
    unguarded_problems,
)
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
from handrail.tools._tool import FunctionTool, Tool, tool
from handrail.tools._toolbox import SchemaTool, Toolbox, Toolset, as_impl

__all__ = [
    "DEFAULT_MAX_ARGUMENT_BYTES",
    "DEFAULT_SERVER",
    "PATH_LIKE_NAMES",
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
    "PathChanged",
    "Question",
    "ReadPath",
    "ResourceLink",
    "Respond",
    "SchemaTool",
    "Submit",
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
    "UnguardedArgumentWarning",
    "Url",
    "WritePath",
    "as_impl",
    "check_argument_payload",
    "issues_from_validation_error",
    "raise_body_error",
    "tool",
    "unguarded_path_arguments",
    "unguarded_problems",
]
