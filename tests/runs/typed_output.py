"""A typed-output run that pauses for approval, decided in another process.

    python typed_output.py DB start
    python typed_output.py DB decide REQUEST_ID

Prints one JSON line: the outcome kind, the output's Python type name and its fields.
"""

from __future__ import annotations

import json
import sys

import anyio
import pydantic

import handrail as hr
from handrail.models import Scripted, call


class Invoice(pydantic.BaseModel):
    """What the run pays."""

    payee: str
    amount: int


@hr.tool(server="ledger")
async def pay(payee: str, amount: int) -> str:
    """Pay."""
    return f"paid {amount} to {payee}"


def build() -> hr.Agent:
    return hr.Agent(Scripted([call("ledger/pay", {"payee": "bob", "amount": 7}),
                              call("handrail/final_result", {"payee": "bob", "amount": 7})]),
                    [pay], output_type=Invoice)


async def main(argv: list[str]) -> None:
    db, mode, *rest = argv
    async with hr.Store.open(db) as store:
        if mode == "start":
            result = await build().run("pay bob", store=store)
        else:
            result = await hr.resume_with_decision(store, rest[0], hr.Decision.approve(),
                                                   agent=build())
    out = result.output if result.outcome.kind == "completed" else None
    print(json.dumps({"run_id": result.run_id, "outcome": result.outcome.kind,
                      "request_id": getattr(result.outcome, "request_id", None),
                      "type": type(out).__name__,
                      "value": out.model_dump() if isinstance(out, Invoice) else None}))


if __name__ == "__main__":
    anyio.run(main, sys.argv[1:])
