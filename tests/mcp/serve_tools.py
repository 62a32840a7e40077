"""Tools `handrail serve` exposes in the tests (imported by the server process)."""

from __future__ import annotations

import os

import handrail as hr


@hr.tool(mutates=False)
def add(a: int, b: int) -> int:
    """Add two numbers (the docstring; the manifest's description replaces it)."""
    return a + b


@hr.tool()
def launch(target: str) -> str:
    """Launch something: mutating, so the default policy asks."""
    log = os.environ["LAUNCH_LOG"]
    with open(log, "a", encoding="utf-8") as f:
        f.write(target + "\n")
    return f"launched {target}"


@hr.tool(mutates=False)
def secret() -> str:
    """Denied by the manifest's policy."""
    return "the secret"


@hr.tool(mutates=False, interactions={"question"})
async def greet(name: str, ctx: hr.CallContext) -> str:
    """Ask how to greet, then greet (a tool that asks its caller)."""
    word = await ctx.ask(hr.Question(f"How should {name} be greeted?"))
    return f"{word}, {name}"


box = hr.Toolbox([add, launch, secret, greet])

MANIFEST = """
[[tools]]
ref = "local/add"
description = "Add two integers."
mutates = false

[[tools]]
ref = "local/launch"
description = "Launch a target."

[[tools]]
ref = "local/secret"
description = "Read the secret."
mutates = false

[[tools]]
ref = "local/greet"
description = "Greet someone."
mutates = false

[policy]
extends = "default"

[[policy.layers]]
name = "team"
deny = ["call:local/secret"]
"""
