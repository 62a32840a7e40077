"""`handrail demo`: the main job, offline.

A scripted model works in a temporary workspace with the built-in tools under the default
policy: a read is allowed, a read of `.env` is denied by the secrets layer, and a write is
deferred for a person. The process exits printing the commands that finish the run in another
process (`handrail pending`, `handrail approve ...`), which rebuilds this agent from the
`agent_ref` the run recorded.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from handrail.builtin import workspace_tools
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply
from handrail.policy import Policy
from handrail.runs import Agent
from handrail.sandbox import find_bwrap, landlock_abi
from handrail.store import RunRecord, Store
from handrail.tools import ToolSpec

__all__ = ["demo_agent", "run_demo"]

TASK = "Summarise the project's README into NOTES.md."
NOTES = "# Notes\n\nhandrail demo: every tool call passed the gate.\n"


TEMPORARY = ".handrail-demo-temporary"
"""Marks a demo workspace to remove when its run ends (absent with `handrail demo --keep`)."""


def _final(root: Path) -> Any:
    def final(messages: Sequence[Any], tools: Sequence[ToolSpec]) -> Turn:
        last = next(m for m in reversed(messages) if isinstance(m, ToolResultMessage))
        text = last.result.render_text()
        # The last turn: the workspace is needed no more, in whichever process ends the run
        # (the run itself stays readable in the store).
        if (root / TEMPORARY).is_file():
            shutil.rmtree(root, ignore_errors=True)
        if last.result.is_error:
            return reply(f"I could not write NOTES.md: {text}")
        return reply("Done: I read README.md, was refused .env (a secret), and wrote NOTES.md.")

    return final


def demo_agent(run: RunRecord | None = None, *, workspace: str | None = None) -> Agent:
    """The demo's agent; `handrail approve`/`resume` rebuild it from the run's record."""
    root = workspace if workspace is not None else (run.workspace if run else None)
    if root is None:
        raise ValueError("demo_agent needs the run's record or a workspace")
    model = Scripted(
        [
            call("workspace/read_file", {"path": "README.md"}),
            call("workspace/read_file", {"path": ".env"}),
            call("workspace/write_file", {"path": "NOTES.md", "content": NOTES}),
            _final(Path(root)),
        ],
        name="scripted-demo",
    )
    return Agent(
        model,
        workspace_tools(),
        policy=Policy.default(),
        instructions="You keep project notes.",
        workspace=root,
        name="demo",
        ref="handrail.cli._demo:demo_agent",
    )


def _seed(root: Path) -> None:
    (root / "README.md").write_text("# Demo project\n\nA tiny project the demo agent reads.\n")
    (root / ".env").write_text("API_TOKEN=this-must-never-reach-the-model\n")


def _command() -> str:
    """How this process was invoked, so the printed commands work when pasted as they are."""
    argv0 = sys.argv[0] if sys.argv else "handrail"
    if argv0.endswith(("__main__.py", "-c")):
        return f"{shlex.quote(sys.executable)} -m handrail.cli"
    on_path = shutil.which("handrail")
    if on_path and os.path.realpath(on_path) == os.path.realpath(argv0):
        return "handrail"
    return shlex.quote(os.path.relpath(argv0) if os.path.isabs(argv0) else argv0)


def sandbox_line(mode: str) -> str:
    """One line saying how the programs an agent starts are confined (docs/sandbox.md)."""
    if mode == "off":
        return "sandbox: off — programs run unconfined (recorded in each program call)"
    bwrap, why = find_bwrap()
    if bwrap is not None:
        return (f"sandbox: {mode} — programs run in bubblewrap ({bwrap}), confined by the "
                "policy")
    version = landlock_abi()
    if version:
        return (f"sandbox: {mode} — bubblewrap unusable ({why}): Landlock ABI {version} "
                "instead (writes outside the workspace and TCP denied; READ denies NOT "
                "enforced" + ("; programs refused where that matters)" if mode == "required"
                              else "); each call that was not confined as the policy says is "
                              "marked"))
    if mode == "required":
        return f"sandbox: required — programs will be refused: {why}; no Landlock either"
    return (f"sandbox: auto — programs run UNCONFINED here: {why}; no Landlock either "
            "(sandbox='required' refuses to start them instead)")


def run_demo(store_path: str, *, keep: bool = False) -> int:
    """Run the demo against the store at `store_path`; returns the exit code.

    The temporary workspace is removed when the run ends (in the process that ends it),
    unless `keep`.
    """
    from rich.console import Console

    console = Console(highlight=False, soft_wrap=True)
    root = Path(tempfile.mkdtemp(prefix="handrail-demo-"))
    _seed(root)
    if not keep:
        (root / TEMPORARY).write_text("removed when the demo run ends; `handrail demo --keep` "
                                      "keeps the workspace\n")
    agent = demo_agent(workspace=str(root))

    async def main() -> Any:
        async with Store.open(store_path) as store:
            return await agent.run(TASK, store=store)

    result = anyio.run(main)
    cmd = _command()
    store_arg = "" if store_path == str(Path(".handrail") / "runs.db") else \
        f" --store {shlex.quote(store_path)}"
    console.print(f"[bold]handrail demo[/] — workspace {root}"
                  + ("" if keep else " (removed when the run ends; --keep keeps it)"))
    console.print(sandbox_line(agent.sandbox))
    console.print(f"run {result.run_id}: {result.outcome.kind}\n")
    console.print(f"  see what happened:   {cmd} show {result.run_id}{store_arg}")
    outcome = result.outcome
    if outcome.kind == "awaiting_approval":
        console.print("\nThe write of NOTES.md waits for a person. Finish the run with:\n")
        console.print(f"  {cmd} pending{store_arg}")
        console.print(f"  {cmd} approve {outcome.request_id}{store_arg}")
        console.print(f"\nor deny it (the model reads the reason):\n\n  {cmd} deny "
                      f"{outcome.request_id} --reason 'not now' --no-resume{store_arg}\n"
                      f"  {cmd} resume {result.run_id}{store_arg}")
        if keep:
            console.print(f"\nThe workspace is kept: once approved, NOTES.md is in {root}")
        else:
            console.print(f"\nThe workspace is removed when the run ends, so NOTES.md cannot be "
                          f"looked at afterwards: `{cmd} demo --keep` keeps it.")
        return 0
    console.print(f"unexpected outcome: {outcome}")
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return 1
