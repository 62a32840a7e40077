"""One of two processes racing to decide the same pending items (tests/store/test_sqlite.py).

    python decider.py DB PORT NAME ROUNDS

For each round it says "ready" to the coordinator (the test) on PORT and waits for "go",
which the coordinator sends to both processes at once; then it decides item `p<round>`.
Prints the rounds it won as a JSON list.
"""

from __future__ import annotations

import json
import sys

import anyio

from handrail.errors import AlreadyDecided
from handrail.store import Store


async def main(db: str, port: str, name: str, rounds: str) -> None:
    won: list[int] = []
    async with Store.open(db) as store, await anyio.connect_tcp("127.0.0.1", int(port)) as link:
        for i in range(int(rounds)):
            await link.send(b"r")
            if await link.receive(1) != b"g":
                raise SystemExit("the coordinator went away")
            try:
                await store.decide(f"p{i}", {"kind": "approve"}, name)
            except AlreadyDecided:
                continue
            won.append(i)
    print(json.dumps(won))


if __name__ == "__main__":
    anyio.run(main, *sys.argv[1:])
