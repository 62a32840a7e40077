"""Programs as tools, in any language: `SubprocessTool` and `load_tool_dir`.

The stdio contract: stdin is the call's input as JSON (the validated arguments the policy
judged), then closed; the environment is only the allowlisted variables the workspace `exec`
tool passes, plus `HANDRAIL_WORKSPACE`, `HANDRAIL_AGENT`, `HANDRAIL_RUN_ID`,
`HANDRAIL_CALL_ID` and what `env=` adds; stdout is the product, stderr diagnostics; a non-zero
exit is an `is_error` result. The program runs in its own process group; on its deadline, a
cancel or the run's teardown the group gets SIGTERM, a grace period, then SIGKILL.

The program is confined like the workspace `exec` tool's (docs/sandbox.md): the sandbox is
derived from the policy in force (`ctx.policy`) and the agent's mode (`ctx.sandbox`); the
record of how is the result's metadata `handrail.sandbox` and `sandbox` in `output.json`.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread

from handrail.errors import ConfigError, UserError
from handrail.host._inject import capture_result, hand_over
from handrail.host._process import (
    DEFAULT_GRACE_SECONDS,
    ProcessCapture,
    Projection,
    passed_environment,
    run_process,
)
from handrail.host._records import current_call
from handrail.sandbox import SandboxUnavailable, wrap
from handrail.tools import Action, CallContext, SchemaTool, ToolId, ToolResult, ToolSpec

__all__ = ["SubprocessTool", "load_tool_dir"]


class SubprocessTool(SchemaTool):
    """A program as a tool: JSON in on stdin, its output back as the result.

    ```python
    tool = hr.SubprocessTool("wc", ["wc", "-c"], {"type": "object"}, "Count bytes.")
    ```

    Args:
        name: The tool's name on its server.
        argv: The program and its arguments (no shell).
        input_schema: JSON Schema of the input (an object schema).
        description: What the model is told it does.
        server: The server part of its id (`server/name`).
        cwd: Its working directory; default the agent's workspace.
        env: Variables added to its environment.
        timeout: Its deadline in seconds (the call is then IN_DOUBT, the group killed).
        mutates: Whether a call may change the world.
        actions: What a call touches, from its input, for the policy; default
            `call server/name`.
        grace: Seconds between SIGTERM and SIGKILL.
        projection: How much of each stream the model sees; default the agent's, else
            16 KiB + 16 KiB.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        input_schema: Mapping[str, Any],
        description: str,
        *,
        server: str = "local",
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        mutates: bool = True,
        actions: Callable[[dict[str, Any]], list[Action]] | None = None,
        grace: float = DEFAULT_GRACE_SECONDS,
        projection: Projection | None = None,
    ) -> None:
        if isinstance(argv, str | bytes) or not argv or \
                not all(isinstance(a, str) and a and "\x00" not in a for a in argv[:1]) or \
                not all(isinstance(a, str) and "\x00" not in a for a in argv):
            raise UserError(f"SubprocessTool {name!r}: argv must be a non-empty list of "
                            "strings (the program first), e.g. ['./run']")
        if not isinstance(grace, int | float) or grace < 0:
            raise UserError(f"SubprocessTool {name!r}: grace must be a non-negative number")
        spec = ToolSpec(ToolId.of(f"{server}/{name}"), description, dict(input_schema),
                        mutates=mutates, timeout=timeout)
        super().__init__(spec, self._spawn, origin=f"program {argv[0]}")
        self.argv = list(argv)
        self.cwd = None if cwd is None else Path(cwd)
        self.env = dict(env or {})
        self.grace = float(grace)
        self.projection = projection
        self._actions = actions

    def actions(self, validated: dict[str, Any]) -> list[Action]:
        """`call server/name`, or what `actions=` says."""
        if self._actions is None:
            return [self.default_action()]
        acts = list(self._actions(dict(validated)))
        if not acts or not all(isinstance(a, Action) for a in acts):
            raise UserError(f"tool '{self.spec.id}': actions() must return a non-empty list "
                            "of hr.Action")
        return acts

    async def _spawn(self, validated: dict[str, Any], ctx: CallContext) -> ToolResult:
        slot = current_call()
        projection = self.projection or (slot.projection if slot is not None else None)
        capture = ProcessCapture.new(projection,
                                     keep_full=slot is not None and slot.path is not None)
        env = passed_environment({
            "HANDRAIL_WORKSPACE": str(ctx.workspace or ""),
            "HANDRAIL_AGENT": ctx.agent or "",
            "HANDRAIL_RUN_ID": ctx.run_id or "",
            "HANDRAIL_CALL_ID": ctx.call_id,
        })
        env.update(self.env)
        stdin = json.dumps(validated, ensure_ascii=False, separators=(",", ":")).encode()
        # The sandbox's root is the agent's workspace (the policy's paths are relative to
        # it); a tool's own cwd is only where the program starts.
        root = Path(ctx.workspace) if ctx.workspace is not None else (self.cwd or Path.cwd())
        cwd = self.cwd if self.cwd is not None else root
        try:
            # The same confinement as `exec`, from the same policy; off the loop (it walks
            # the workspace). Unavailable (`required`, a cwd it cannot see): nothing starts.
            argv, confinement = await anyio.to_thread.run_sync(
                lambda: wrap(self.argv, policy=ctx.policy, workspace=root, mode=ctx.sandbox,
                             cwd=cwd))
        except SandboxUnavailable as exc:
            return ToolResult.error(f"tool '{self.spec.id}': {exc}")
        if slot is not None:
            slot.extra["sandbox"] = confinement
        try:
            # Spawned from the event loop's thread: bwrap's --die-with-parent follows the
            # spawning thread (docs/sandbox.md).
            await run_process(argv, capture, stdin=stdin, cwd=cwd, env=env,
                              grace=self.grace,
                              bwrap=confinement.get("mechanism") == "bwrap")
        finally:
            # Cut off (deadline, cancel) or not, the record gets what the program wrote.
            hand_over(capture, source="subprocess")
        result = capture_result(capture, None if slot is None else slot.output_path,
                                source="subprocess")
        return ToolResult(result.content, result.structured, result.is_error,
                          {**result.metadata, "handrail.sandbox": confinement})


_TOML_KEYS: dict[str, type | tuple[type, ...]] = {
    "server": str, "timeout": (int, float), "mutates": bool,
}


def load_tool_dir(path: str | os.PathLike[str]) -> list[SubprocessTool]:
    """Load every tool of a folder, each a subfolder holding a program and its declaration.

    A tool's subfolder holds an executable `run` (any language), `schema.json` and
    `description.md`, and optionally `tool.toml` with `server`, `timeout`, `mutates`. The
    subfolder's name is the tool's name. Hidden entries and plain files are skipped.

    Raises:
        ConfigError: the folder is missing, or any tool folder is malformed; the message
            names every file and its problem, and nothing is loaded.
    """
    root = Path(path)
    if not root.is_dir():
        raise ConfigError(f"tool folder {str(root)!r} is not a directory")
    problems: list[str] = []
    tools: list[SubprocessTool] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        tool = _load_one(folder, problems)
        if tool is not None:
            tools.append(tool)
    if problems:
        raise ConfigError("cannot load the tools of " + str(root) + ":\n" +
                          "\n".join(f"  - {p}" for p in problems))
    return tools


def _not_positive(value: Any) -> bool:
    return isinstance(value, bool) or not value > 0


def _load_one(folder: Path, problems: list[str]) -> SubprocessTool | None:
    before = len(problems)
    run = folder / "run"
    if not run.is_file():
        problems.append(f"{run}: missing (the tool's program, executable)")
    elif not os.access(run, os.X_OK):
        problems.append(f"{run}: not executable (chmod +x it)")
    schema: Any = None
    schema_file = folder / "schema.json"
    try:
        schema = json.loads(schema_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{schema_file}: missing (the JSON Schema of the tool's input)")
    except (OSError, ValueError) as exc:
        problems.append(f"{schema_file}: not valid JSON: {exc}")
    else:
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            problems.append(f"{schema_file}: must be a JSON Schema of an object "
                            "(\"type\": \"object\")")
    description_file = folder / "description.md"
    description = ""
    try:
        description = description_file.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        problems.append(f"{description_file}: missing (what the model is told the tool does)")
    except (OSError, ValueError) as exc:
        problems.append(f"{description_file}: unreadable: {exc}")
    options: dict[str, Any] = {}
    toml_file = folder / "tool.toml"
    if toml_file.exists():
        try:
            options = tomllib.loads(toml_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            problems.append(f"{toml_file}: not valid TOML: {exc}")
        for key, value in options.items():
            kind = _TOML_KEYS.get(key)
            if kind is None:
                problems.append(f"{toml_file}: unknown key {key!r} (known: "
                                f"{', '.join(sorted(_TOML_KEYS))})")
            elif not isinstance(value, kind) or (key == "timeout" and _not_positive(value)):
                problems.append(f"{toml_file}: {key} = {value!r} is not a valid {key}")
    if len(problems) > before:
        return None
    try:
        return SubprocessTool(folder.name, [str(run.resolve())], schema, description,
                              **options)
    except UserError as exc:
        problems.append(f"{folder}: {exc}")
        return None
