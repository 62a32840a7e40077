"""Per-call overhead of `box.call` on a trivial async tool, beside pydantic doing the same work.

The floor is the least any typed tool call can do: validate the JSON arguments with a
`TypeAdapter(TypedDict)`, await the function, serialise its int result with
`TypeAdapter(int)`. handrail adds the size cap, the registry lookup, a call id, a context-free
dispatch, output checking and a `ToolResult`. Target: at most 5x the floor.

Run: `.venv/bin/python benchmarks/tool_call.py [--calls 10000] [--repeats 7]`
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio
from pydantic import TypeAdapter
from typing_extensions import TypedDict

import handrail as hr


async def add(a: int, b: int) -> int:
    return a + b


class AddArgs(TypedDict):
    a: int
    b: int


ARGS = {"a": 1, "b": 2}
TEXT = '{"a": 1, "b": 2}'


def make_cases() -> dict[str, Callable[[], Awaitable[object]]]:
    box = hr.Toolbox([hr.tool(add)])
    args_adapter = TypeAdapter(AddArgs)
    int_adapter = TypeAdapter(int)
    validate_json, validate_python = args_adapter.validate_json, args_adapter.validate_python
    dump_json = int_adapter.dump_json
    call = box.call

    async def floor_json() -> object:
        return dump_json(await add(**validate_json(TEXT)))

    async def floor_dict() -> object:
        return dump_json(await add(**validate_python(ARGS)))

    async def box_dict() -> object:
        return await call("add", ARGS)

    async def box_json() -> object:
        return await call("add", TEXT)

    return {
        "floor: TypeAdapter validate_json + call + dump_json": floor_json,
        "floor: TypeAdapter validate_python + call + dump_json": floor_dict,
        "box.call(dict arguments)": box_dict,
        "box.call(JSON text arguments)": box_json,
    }


async def measure(fn: Callable[[], Awaitable[object]], calls: int) -> float:
    """Microseconds per call over `calls` calls."""
    start = time.perf_counter_ns()
    for _ in range(calls):
        await fn()
    return (time.perf_counter_ns() - start) / calls / 1000


async def main(calls: int, repeats: int) -> None:
    cases = make_cases()
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for fn in cases.values():  # warm up every path (lazy imports, caches)
        await measure(fn, 500)
    for _ in range(repeats):
        for name, fn in cases.items():  # interleaved, so drift hits every case alike
            samples[name].append(await measure(fn, calls))
    medians = {name: statistics.median(values) for name, values in samples.items()}
    floor = medians["floor: TypeAdapter validate_json + call + dump_json"]
    width = max(map(len, medians))
    print(f"{calls} calls x {repeats} repeats, median µs per call (asyncio)\n")
    print(f"{'case':<{width}}  {'µs/call':>8}  {'min':>7}  {'x floor':>7}")
    print(f"{'-' * width}  {'-' * 8}  {'-' * 7}  {'-' * 7}")
    for name, median in medians.items():
        print(f"{name:<{width}}  {median:8.2f}  {min(samples[name]):7.2f}  "
              f"{median / floor:6.2f}x")
    worst = max(medians["box.call(dict arguments)"], medians["box.call(JSON text arguments)"])
    verdict = "within" if worst <= 5 * floor else "OVER"
    print(f"\nworst box.call is {worst / floor:.2f}x the floor ({verdict} the 5x target)")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--calls", type=int, default=10_000)
        parser.add_argument("--repeats", type=int, default=7)
        options = parser.parse_args()
        anyio.run(main, options.calls, options.repeats)
