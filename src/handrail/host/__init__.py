"""Host tools: injected and routed tools, programs as tools, the per-call disk record.

All of them pass the same nine stages of the gate (docs/host-tools.md).

It also holds the one implementation of spawning a program, killing its process group and
projecting its output, which the workspace `exec` tool runs on too.
"""

from handrail.host._inject import (
    DEFAULT_ROUTE_TIMEOUT,
    InjectedTool,
    InjectionToolset,
    RoutedCall,
    RoutedCapture,
    Stop,
    ToolInjection,
    capture_result,
    hand_over,
    merged_toolbox,
)
from handrail.host._process import (
    DEFAULT_GRACE_SECONDS,
    DEFAULT_HEAD_BYTES,
    DEFAULT_TAIL_BYTES,
    PASSED_ENVIRONMENT,
    RECORD_LIMIT_BYTES,
    ProcessCapture,
    Projection,
    StreamCapture,
    kill_all_now,
    passed_environment,
    run_process,
)
from handrail.host._records import CallRecords, CallSlot, current_call, record_dir
from handrail.host._subprocess import SubprocessTool, load_tool_dir

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "DEFAULT_HEAD_BYTES",
    "DEFAULT_ROUTE_TIMEOUT",
    "DEFAULT_TAIL_BYTES",
    "PASSED_ENVIRONMENT",
    "RECORD_LIMIT_BYTES",
    "CallRecords",
    "CallSlot",
    "InjectedTool",
    "InjectionToolset",
    "ProcessCapture",
    "Projection",
    "RoutedCall",
    "RoutedCapture",
    "Stop",
    "StreamCapture",
    "SubprocessTool",
    "ToolInjection",
    "capture_result",
    "current_call",
    "hand_over",
    "kill_all_now",
    "load_tool_dir",
    "merged_toolbox",
    "passed_environment",
    "record_dir",
    "run_process",
]
