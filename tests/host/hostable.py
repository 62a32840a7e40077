"""A host-tool run driven from the command line, for the cross-process tests.

    python hostable.py DB RECORDS EFFECTS start|decide ID|hang FIFO

`build()` rebuilds the same host and agent in every process: an injected `local/put` whose
router appends the input to EFFECTS (so a test counts how often it was routed), and a
subprocess tool `local/hang` that tells FIFO it is running and then sleeps.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, call, reply

SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


class Host:
    """Routes `local/put` by appending to the effects file."""

    def __init__(self, effects: str) -> None:
        self.effects = effects

    def tools(self) -> list[hr.InjectedTool]:
        return [hr.InjectedTool("put", SCHEMA, "Store a note.")]

    def route(self, c: hr.RoutedCall) -> hr.RoutedCapture:
        with open(self.effects, "a") as fh:
            fh.write(c.input["text"] + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return hr.RoutedCapture(stdout=b"stored", stderr=b"", exit_code=0)


def build(records: str, effects: str, fifo: str = "") -> hr.Agent:
    hang = hr.SubprocessTool("hang", ["sh", "-c", 'echo "$$" > "$FIFO"; exec sleep 1000'],
                             {"type": "object"}, "Hang.", env={"FIFO": fifo})
    turns = ([call("local/hang", {}), reply("done")] if fifo else
             [call("local/put", {"text": "secret note"}), reply("done")])
    policy = hr.Policy.default()  # asks for both: a person decides
    if fifo:
        policy = policy.layer("app").allow(hr.Act.CALL, "local/hang")
    # sandbox="off": the FIFO is in the test's /tmp, which a confined program cannot see
    # (its /tmp is private; docs/sandbox.md). These tests are about records, not confinement.
    return hr.Agent(Scripted(turns), [hang], injection=Host(effects), policy=policy,
                    records_dir=records, name="hostable", sandbox="off")


async def main(argv: list[str]) -> None:
    db, records, effects, mode, *rest = argv
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await build(records, effects).run("note it", store=store)
        elif mode == "decide":
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=build(records, effects))
        elif mode == "hang":
            result = await build(records, effects, rest[0]).run("hang", store=store)
        else:
            raise SystemExit(f"unknown mode {mode}")
    print(json.dumps({"run_id": result.run_id, "outcome": result.outcome.kind,
                      "detail": vars_of(result.outcome)}))


def vars_of(obj: Any) -> dict[str, Any]:
    return {f: getattr(obj, f) for f in obj.__dataclass_fields__}


if __name__ == "__main__":
    try:
        anyio.run(main, sys.argv[1:])
    except hr.HandrailError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
