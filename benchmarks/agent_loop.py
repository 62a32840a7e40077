"""Per-tool-call cost of a whole agent loop: handrail beside its peers, in the same run.

A scripted model asks for a trivial async `add(a, b)` N times (one call per turn), then
answers. Each variant x N runs in a fresh process: imports and a 5-call warm-up run are
excluded, then one run of N calls is timed. The driver prints median µs per call, the ratio to
handrail (memory), how per-call cost grows with N, and `import` times.

    benchmarks/setup-peers                      # once: a venv with the peers
    benchmarks/.peers-venv/bin/python benchmarks/agent_loop.py [--reps 5] [--ns 100,1000]

Variants whose framework is not installed are reported as missing, not silently dropped.

The calibration (issue 38): `floor_memory` and `floor_sqlite` run `../shared/bench-peers/
floor.py`'s floor loop (a scripted call, pydantic validation, the tool, the three records as
JSON; + one WAL commit of one row) in the same kind of child, so every table has its floor
measured in the same run, and the CPU table prints each variant's ratio to it: microseconds
describe the machine, the ratio describes handrail. `benchmarks/instructions.py` gives the
same ratios in instructions, which no load moves.

Tracing (issue 20): `handrail_memory_otel` is handrail with OpenTelemetry on (the SDK's tracer
and meter providers, spans to an exporter that drops them); `handrail_memory` has no provider
configured, so tracing is off.

Each child collects its heap once before the timed run (the warm-up's garbage, the script it
built). Where the time goes (issue 11): each child also reports the CPU its garbage collector took
(`gc.callbacks`), and `--model-share` times the scripted model's `request` inside the run
(wrapped, so off by default): handrail's own share is the rest. `--gc-freeze` freezes the
heap again after the warm-up (`gc.freeze()`; handrail itself freezes start-up once, at the
warm-up run, `handrail.collector.freeze_start_up`).

Before/after: `--against SRC` (alias `--baseline`) also runs every handrail variant from `SRC`
(another checkout's `src/`), interleaved process by process, as '<variant> (before)':

    git archive <commit> src | tar -x -C /tmp/base
    .venv/bin/python benchmarks/agent_loop.py --only handrail_memory,handrail_memory_otel \
        --against /tmp/base/src --reps 11
"""

# No `from __future__ import annotations`: LangGraph reads the State TypedDict's annotations
# at runtime, and they name locals of the function that defines it.
import argparse
import asyncio
import contextlib
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------- variants
# Each returns an async run() that performs one whole agent run of n calls and returns the
# number of tool calls executed.


def _telemetry() -> Any:
    """handrail's telemetry on the OpenTelemetry SDK, every span dropped by the exporter."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    import handrail as hr

    class Dropping(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    _KEEP.append((tracer_provider, meter_provider))
    return hr.Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)


def _handrail(n: int, store_kind: str, traced: bool = False) -> Callable[[], Any]:
    import handrail as hr
    from handrail.models import Scripted, Turn, call, reply

    calls = 0

    @hr.tool(mutates=False)
    async def add(a: int, b: int) -> int:
        nonlocal calls
        calls += 1
        return a + b

    turns: list[Any] = [call("add", {"a": i, "b": 1}) for i in range(n)]

    def final(messages: Any, tools: Any) -> Turn:
        last = messages[-1]
        assert last.result.structured == n, last
        return reply(f"done {n}")

    turns.append(final)
    # The option only when asked for: the same script measures builds without it.
    options: dict[str, Any] = {"telemetry": _telemetry()} if traced else {}
    agent = hr.Agent(Scripted(turns), [add], policy=hr.Policy.default(), max_steps=n + 5,
                     **options)
    tmp = tempfile.mkdtemp()

    async def run() -> int:
        nonlocal calls
        calls = 0
        if store_kind == "memory":
            store = hr.Store.memory()
        elif store_kind == "postgres":
            # The database the driver made for this child (`_postgres_server`); it persists
            # from run to run, as a real store does.
            store = hr.Store.open(os.environ[PG_URL])
        else:
            # The option only when asked for: the same script measures builds without it.
            options = {"durability": "fsync"} if store_kind == "fsync" else {}
            path = os.path.join(tmp, f"runs-{time.perf_counter_ns()}.db")
            store = hr.Store.open(path, **options)
        result = await agent.run("add things", store=store)
        if store_kind == "postgres":
            SERVER_CPU[:] = [_server_cpu() or 0.0]
        await store.close()
        if store_kind not in ("memory", "postgres"):
            for leftover in glob.glob(path + "*"):  # the file, its WAL and shared memory
                # (The store's thread may be closing its last connection, which removes
                # the WAL and its shared memory itself.)
                with contextlib.suppress(FileNotFoundError):
                    os.remove(leftover)
        assert result.output == f"done {n}", result.outcome
        return calls

    return run


def _pydantic_ai(n: int) -> Callable[[], Any]:
    from pydantic_ai import Agent, Tool
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel
    from pydantic_ai.usage import RequestUsage, UsageLimits

    calls = 0
    step = 0

    async def add(a: int, b: int) -> int:
        nonlocal calls
        calls += 1
        return a + b

    usage = RequestUsage(input_tokens=1, output_tokens=1)

    async def model_fn(messages: Any, info: AgentInfo) -> ModelResponse:
        nonlocal step
        i = step
        step += 1
        if i < n:
            return ModelResponse(parts=[ToolCallPart("add", f'{{"a": {i}, "b": 1}}',
                                                     tool_call_id=f"call_{i}")], usage=usage)
        return ModelResponse(parts=[TextPart(f"done {n}")], usage=usage)

    agent = Agent(FunctionModel(model_fn), tools=[Tool(add, takes_ctx=False, name="add")])

    async def run() -> int:
        nonlocal calls, step
        calls = step = 0
        result = await agent.run("add things", usage_limits=UsageLimits(request_limit=None))
        assert result.output == f"done {n}"
        return calls

    return run


def _openai_agents(n: int) -> Callable[[], Any]:
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)
    calls = 0

    async def add(a: int, b: int) -> int:
        nonlocal calls
        calls += 1
        return a + b

    class Scripted(Model):
        def __init__(self) -> None:
            self.i = 0

        async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
            i = self.i
            self.i += 1
            out: list[Any]
            if i < n:
                out = [ResponseFunctionToolCall(id=f"fc_{i}", call_id=f"call_{i}",
                                                type="function_call", name="add",
                                                arguments=f'{{"a": {i}, "b": 1}}')]
            else:
                out = [ResponseOutputMessage(
                    id="final", type="message", role="assistant", status="completed",
                    content=[ResponseOutputText(text=f"done {n}", type="output_text",
                                                annotations=[])])]
            return ModelResponse(output=out, usage=Usage(requests=1, input_tokens=1,
                                                         output_tokens=1, total_tokens=2),
                                 response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    model = Scripted()
    agent = Agent(name="bench", instructions="add", model=model,
                  tools=[function_tool(add, name_override="add")])
    config = RunConfig(tracing_disabled=True)

    async def run() -> int:
        nonlocal calls
        calls = 0
        model.i = 0
        result = await Runner.run(agent, "add things", max_turns=n + 5, run_config=config)
        assert result.final_output == f"done {n}"
        return calls

    return run


def _langgraph(n: int, checkpoint: bool) -> Callable[[], Any]:
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.prebuilt import ToolNode

    calls = 0

    @tool
    async def add(a: int, b: int) -> int:
        """Add two numbers."""
        nonlocal calls
        calls += 1
        return a + b

    class State(TypedDict):
        messages: Annotated[list[Any], add_messages]
        step: int

    def model_node(state: State) -> dict[str, Any]:
        i = state["step"]
        if i < n:
            msg = AIMessage(content="", tool_calls=[{"name": "add", "args": {"a": i, "b": 1},
                                                     "id": f"call_{i}"}])
        else:
            msg = AIMessage(content=f"done {n}")
        return {"messages": [msg], "step": i + 1}

    def route(state: State) -> str:
        return "tools" if state["messages"][-1].tool_calls else END

    graph = StateGraph(State)
    graph.add_node("model", model_node)
    graph.add_node("tools", ToolNode([add]))
    graph.set_entry_point("model")
    graph.add_conditional_edges("model", route, {"tools": "tools", END: END})
    graph.add_edge("tools", "model")
    saver = None
    if checkpoint:
        from langgraph.checkpoint.memory import InMemorySaver

        saver = InMemorySaver()
    app = graph.compile(checkpointer=saver)
    counter = 0

    async def run() -> int:
        nonlocal calls, counter
        calls = 0
        counter += 1
        config = {"recursion_limit": 2 * n + 10,
                  "configurable": {"thread_id": f"t{counter}"}}
        out = await app.ainvoke({"messages": [HumanMessage("add things")], "step": 0},
                                config=config)
        assert out["messages"][-1].content == f"done {n}"
        return calls

    return run


_KEEP: list[Any] = []


def _openai_adapter(n: int) -> Callable[[], Any]:
    """The whole loop with the real OpenAIChat adapter against a loopback server."""
    sys.path.insert(0, str(HERE))
    from openai_adapter import _serving  # type: ignore[import-not-found]

    import handrail as hr
    from handrail.models import OpenAIChat

    calls = 0

    @hr.tool(mutates=False)
    async def lookup(key: str) -> str:
        nonlocal calls
        calls += 1
        return key.upper()

    server = _serving(n)
    _KEEP.append(server)  # dropping the context manager would stop the server process
    port = server.__enter__()
    model = OpenAIChat("bench-model", base_url=f"http://127.0.0.1:{port}/v1", api_key="bench")
    agent = hr.Agent(model, [lookup], policy=hr.Policy.default(), max_steps=n + 5)

    async def run() -> int:
        nonlocal calls
        calls = 0
        result = await agent.run("look up every key", store=hr.Store.memory())
        assert result.output == "All keys looked up.", result.outcome
        return calls

    return run


FLOOR = next((p / "shared" / "bench-peers" / "floor.py"
              for p in Path(__file__).resolve().parents
              if (p / "shared" / "bench-peers" / "floor.py").exists()), None)
"""`../shared/bench-peers/floor.py`: the least a recorded call can cost, in plain Python."""


def _floor(n: int, mode: str, floor: str | Path | None = None) -> Callable[[], Any]:
    """The floor's loop (floor.py, `floor` or where it lies beside us): the calibration row."""
    import importlib.util

    floor = floor or FLOOR
    if floor is None or not Path(floor).exists():
        raise SystemExit(f"the floor ({floor or '../shared/bench-peers/floor.py'}) is missing")
    spec = importlib.util.spec_from_file_location("floor", floor)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tmp = tempfile.mkdtemp()

    async def run() -> int:
        path = os.path.join(tmp, f"floor-{time.perf_counter_ns()}.db")
        await module.floor_loop(n, mode, path)
        for leftover in glob.glob(path + "*"):
            os.remove(leftover)
        return n

    return run


VARIANTS: dict[str, tuple[str, Callable[[int], Callable[[], Any]]]] = {
    "floor_memory": ("the floor: validate + call + 3 JSON records (floor.py, memory)",
                     lambda n: _floor(n, "memory")),
    "floor_sqlite": ("the floor + one WAL commit of one row (floor.py, SQLite NORMAL)",
                     lambda n: _floor(n, "one")),
    "handrail_memory": ("handrail, memory store", lambda n: _handrail(n, "memory")),
    "handrail_memory_otel": ("handrail, memory store, OpenTelemetry SDK on (spans dropped)",
                             lambda n: _handrail(n, "memory", traced=True)),
    "handrail_sqlite": ("handrail, SQLite store (file)", lambda n: _handrail(n, "sqlite")),
    "handrail_postgres": ("handrail, PostgreSQL store (local server, unix socket)",
                          lambda n: _handrail(n, "postgres")),
    "handrail_sqlite_fsync": ("handrail, SQLite store (file), durability=\"fsync\"",
                              lambda n: _handrail(n, "fsync")),
    "handrail_openai_http": ("handrail + OpenAIChat adapter, loopback server, memory store",
                             _openai_adapter),
    "pydantic_ai": ("Pydantic AI (FunctionModel)", _pydantic_ai),
    "openai_agents": ("OpenAI Agents SDK (scripted Model)", _openai_agents),
    "langgraph": ("LangGraph (StateGraph + ToolNode)", lambda n: _langgraph(n, False)),
    "langgraph_ckpt": ("LangGraph + InMemorySaver", lambda n: _langgraph(n, True)),
}

IMPORTS = {
    "handrail": "import handrail",
    # Public names load lazily; this is what a program that builds an agent pays.
    "handrail, agent core loaded": "import handrail as hr; hr.Agent, hr.tool, hr.Toolbox, "
                                   "hr.Store, hr.Policy, hr.Manifest",
    "pydantic_ai": "import pydantic_ai",
    "openai_agents": "import agents",
    "langgraph": "import langgraph.graph, langgraph.prebuilt",
}


def compiled(*trees: str | Path) -> None:
    """Compile each source tree's modules to bytecode, so that no child compiles at start-up.

    A process that imports a module from its source (no valid .pyc: a fresh copy, a file
    just edited, PYTHONDONTWRITEBYTECODE=1) allocates and frees megabytes compiling it, and
    its heap then holds free memory its run reuses: ~0.4 fewer minor page faults a durable
    SQLite call, 3-4 µs of kernel time each on the 2-core VM. One build compiled and the
    other not measured that instead of their difference (issue 42: a "cost" of the audit
    chain that was the chain-less copy compiling its sources in every child). Only what is
    missing or stale is written (the .pyc files sit in `__pycache__`, which git ignores).
    """
    import compileall

    for tree in trees:
        if not compileall.compile_dir(str(tree), quiet=1):
            raise SystemExit(f"{tree}: a module does not compile")


WARMUP = 5


BEFORE = " (before)"
"""The suffix of a variant run from the `--against` build."""

PG_URL = "HANDRAIL_BENCH_PG_URL"
"""The environment variable naming the PostgreSQL database a `handrail_postgres` child uses."""
PG_PIDFILE = "HANDRAIL_BENCH_PG_PIDFILE"
"""... and the server's `postmaster.pid`: the child adds up the server's CPU around its run."""


def _server_cpu() -> float | None:
    """CPU seconds the PostgreSQL server's live processes have taken so far.

    The postmaster and its children (the store's backends, the WAL writer, the checkpointer,
    ...), from /proc's schedstat (nanoseconds; stat's ticks are 10 ms): a durable call's cost
    on PostgreSQL is mostly the server's. Read before the run and before the store closes
    (its pool's backends end at the close): a backend that ended in between is not counted.
    None without a server to read.
    """
    pidfile = os.environ.get(PG_PIDFILE)
    if not pidfile or not os.path.isdir("/proc"):
        return None
    with open(pidfile) as f:
        postmaster = int(f.readline())
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rpartition(")")[2].split()[1])
            if int(entry) != postmaster and parent != postmaster:
                continue
            with open(f"/proc/{entry}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # (a process that ended meanwhile)
    return total / 1e9


SERVER_CPU: list[float] = []
"""The server's CPU read just before a postgres run closes its store (`_server_cpu`)."""


@contextlib.contextmanager
def _postgres_server(wanted: bool) -> Any:
    """A throwaway local PostgreSQL server (tests/pgserver.py) for the postgres variant.

    As the tests run it (fsync off, like the SQLite variant's synchronous=NORMAL: a commit
    waits for no disk), so the CPU figures are the work, not the disk's latency. Yields the
    server, or None when not wanted or when none can be started here (the variant is then
    reported missing).
    """
    if not wanted:
        yield None
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    import pgserver

    why = pgserver.unavailable()
    if why is not None:
        print(f"handrail_postgres: {why}", file=sys.stderr)
        yield None
        return
    server = pgserver.start()
    try:
        yield server
    finally:
        pgserver.stop(server)


def _label(name: str) -> str:
    base = name.removesuffix(BEFORE)
    return VARIANTS[base][0] + (BEFORE if name != base else "")


def _time_the_model() -> list[float]:
    """Wrap the scripted model's `request` to add up the CPU it takes (the model's share)."""
    from handrail.models import Scripted

    spent = [0.0]
    request = Scripted.request

    async def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        t0 = time.process_time()
        try:
            return await request(self, *args, **kwargs)
        finally:
            spent[0] += time.process_time() - t0

    Scripted.request = timed  # type: ignore[method-assign]
    return spent


def child(variant: str, n: int, model_share: bool = False, gc_freeze: bool = False) -> None:
    """One variant x one N in this process: build, then time one whole run."""
    import gc

    loop = asyncio.new_event_loop()
    # Warm up with a short run of the same variant (first-call caches, lazy imports), then
    # time the first run at N: the same treatment at every N, and affordable for peers that
    # take minutes per run at N=1000.
    loop.run_until_complete(VARIANTS[variant][1](WARMUP)())
    run = VARIANTS[variant][1](n)
    model = _time_the_model() if model_share and variant.startswith("handrail") else None
    # The timed run starts from a collected heap: the warm-up's garbage and the script this
    # process built for the run (a Turn, two tuples and a dict a call, made before the clock
    # starts) are not the loop's to pay for. Every variant gets the same.
    gc.collect()
    if gc_freeze:
        gc.freeze()
    collecting = [0.0, 0.0]  # CPU the collector took, and when the current pass began

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            collecting[1] = time.process_time()
        else:
            collecting[0] += time.process_time() - collecting[1]

    gc.callbacks.append(on_gc)
    server0 = _server_cpu()
    t0, cpu0 = time.perf_counter(), time.process_time()
    calls = loop.run_until_complete(run())
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    server1 = SERVER_CPU[0] if SERVER_CPU else None
    gc.callbacks.remove(on_gc)
    assert calls == n, (calls, n)
    print(json.dumps({"variant": variant, "n": n, "seconds": elapsed, "cpu": cpu,
                      "gc_cpu": collecting[0], "model_cpu": model[0] if model else None,
                      "server_cpu": None if server0 is None or server1 is None
                      else server1 - server0}))


def _import_ms(statement: str, reps: int) -> float | None:
    def once(code: str) -> float:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
        return time.perf_counter() - t0

    try:
        once(statement)
    except subprocess.CalledProcessError:
        return None
    base = statistics.median(once("pass") for _ in range(reps))
    return 1e3 * (statistics.median(once(statement) for _ in range(reps)) - base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ns", default="100,1000")
    parser.add_argument("--only", default="", help="comma-separated variant names")
    parser.add_argument("--against", "--baseline", dest="against", default="",
                        help="a src folder of another build (say main's): each handrail "
                             "variant also runs from it, interleaved process by process, "
                             "as '<variant> (before)'")
    parser.add_argument("--model-share", action="store_true",
                        help="time the scripted model's request inside handrail's runs")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() after the warm-up (a host's choice)")
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0].removesuffix(BEFORE), int(args.child[1]), args.model_share,
              args.gc_freeze)
        return
    flags = (["--model-share"] if args.model_share else []) + (
        ["--gc-freeze"] if args.gc_freeze else [])
    ns = [int(x) for x in args.ns.split(",")]
    names = [v for v in VARIANTS if not args.only or v in args.only.split(",")]
    if args.against:
        names = [n for v in names for n in ((v + BEFORE, v) if v.startswith("handrail") else (v,))]
    if FLOOR is None:
        print("the floor (../shared/bench-peers/floor.py) is not beside this checkout: its rows "
              "are missing, and so are the ratios to it", file=sys.stderr)
    compiled(HERE.parent / "src", *([args.against] if args.against else []))
    env_before = {**os.environ, "PYTHONPATH": os.path.abspath(args.against)}
    times: dict[tuple[str, int], list[float]] = {}
    # CPU time (all threads, kernel included): steadier than wall time on a shared machine.
    cpus: dict[tuple[str, int], list[float]] = {}
    gcs: dict[tuple[str, int], list[float]] = {}
    models: dict[tuple[str, int], list[float]] = {}
    servers: dict[tuple[str, int], list[float]] = {}
    missing: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(_postgres_server(
            any("postgres" in name for name in names)))
        _run_children(args.reps, ns, names, flags, env_before, server, times, cpus, gcs,
                      models, servers, missing)
    _report(args, ns, names, times, cpus, gcs, models, servers, missing)


def _run_children(reps: int, ns: list[int], names: list[str], flags: list[str],
                  env_before: dict[str, str], server: Any,
                  times: dict[tuple[str, int], list[float]],
                  cpus: dict[tuple[str, int], list[float]],
                  gcs: dict[tuple[str, int], list[float]],
                  models: dict[tuple[str, int], list[float]],
                  servers: dict[tuple[str, int], list[float]], missing: dict[str, str]) -> None:
    for rep in range(reps):
        for n in ns:
            for name in names:
                if name in missing:
                    continue
                env = dict(env_before if name.endswith(BEFORE) else os.environ)
                database = None
                if "postgres" in name:
                    if server is None:
                        missing[name] = "no PostgreSQL server here (tests/pgserver.py)"
                        continue
                    database = server.create_database()
                    env[PG_URL] = database
                    env[PG_PIDFILE] = str(server.root / "data" / "postmaster.pid")
                try:
                    proc = subprocess.run([sys.executable, __file__, "--child", name, str(n),
                                           *flags], capture_output=True, text=True, env=env)
                finally:
                    if database is not None:
                        server.drop_database(database)
                if proc.returncode:
                    missing[name] = proc.stderr.strip().splitlines()[-1] if proc.stderr else "?"
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                row["variant"] = name
                times.setdefault((name, n), []).append(1e6 * row["seconds"] / n)
                cpus.setdefault((name, n), []).append(1e6 * row.get("cpu", float("nan")) / n)
                gcs.setdefault((name, n), []).append(1e6 * row.get("gc_cpu", float("nan")) / n)
                if row.get("model_cpu") is not None:
                    models.setdefault((name, n), []).append(1e6 * row["model_cpu"] / n)
                if row.get("server_cpu") is not None:
                    servers.setdefault((name, n), []).append(1e6 * row["server_cpu"] / n)
                print(f"rep {rep} n={n:5d} {name:22s} {1e6 * row['seconds'] / n:10.1f} µs/call",
                      file=sys.stderr, flush=True)


def _delta(table: dict[tuple[str, int], list[float]], after: str, before: str, n: int) -> str:
    return f"{statistics.median(table[(after, n)]) - statistics.median(table[(before, n)]):+,.1f}"


def _report(args: Any, ns: list[int], names: list[str],
            times: dict[tuple[str, int], list[float]],
            cpus: dict[tuple[str, int], list[float]],
            gcs: dict[tuple[str, int], list[float]],
            models: dict[tuple[str, int], list[float]],
            servers: dict[tuple[str, int], list[float]], missing: dict[str, str]) -> None:
    print(f"\n## agent loop: median µs per tool call over {args.reps} runs "
          f"(python {sys.version.split()[0]}, {os.cpu_count()} CPUs)\n")
    header = "| variant | " + " | ".join(f"N={n}" for n in ns) + " | × handrail memory (N=" \
             + str(ns[-1]) + ") |"
    print(header)
    print("|---" * (len(ns) + 2) + "|")
    base = times.get(("handrail_memory", ns[-1]))
    for name in names:
        label = _label(name)
        if name in missing:
            print(f"| {label} | " + " | ".join("missing" for _ in ns) + f" | ({missing[name]}) |")
            continue
        cells = [f"{statistics.median(times[(name, n)]):,.1f}" for n in ns]
        ratio = (statistics.median(times[(name, ns[-1])]) / statistics.median(base)
                 if base else float("nan"))
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio:,.1f} |")
    print(f"\nCPU µs per call (median over {args.reps} runs), and the ratio to the floor "
          "measured in this run (a durable store's to the one-commit floor, the rest to the "
          "memory floor; the issue-38 target is 2.0):\n")
    print("| variant | " + " | ".join(f"N={n}" for n in ns) + f" | × floor (N={ns[-1]}) |")
    print("|---" * (len(ns) + 2) + "|")
    for name in names:
        if name not in missing:
            floor = "floor_sqlite" if "sqlite" in name else "floor_memory"
            below = cpus.get((floor, ns[-1]))
            ratio = (f"{statistics.median(cpus[(name, ns[-1])]) / statistics.median(below):.2f}"
                     if below and floor not in name else "-")
            print(f"| {_label(name)} | "
                  + " | ".join(f"{statistics.median(cpus[(name, n)]):,.1f}" for n in ns)
                  + f" | {ratio} |")
    if servers:
        print("\nThe PostgreSQL server's CPU µs per call (its processes, from /proc; the table "
              "above is the client's):\n")
        print("| variant | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---" * (len(ns) + 1) + "|")
        for name in names:
            if all((name, n) in servers for n in ns):
                print(f"| {_label(name)} | " + " | ".join(
                    f"{statistics.median(servers[(name, n)]):,.1f}" for n in ns) + " |")
    pairs = [n for n in names if n.endswith(BEFORE) and n.removesuffix(BEFORE) in names
             and n not in missing and n.removesuffix(BEFORE) not in missing]
    if pairs:
        print("\nThis build minus `--against`'s (medians), CPU µs per call:\n")
        print("| variant | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---" * (len(ns) + 1) + "|")
        for before in pairs:
            after = before.removesuffix(BEFORE)
            print(f"| {_label(after)} | " + " | ".join(
                _delta(cpus, after, before, n) for n in ns) + " |")
            if all((after, n) in servers and (before, n) in servers for n in ns):
                print(f"| {_label(after)}: the server | " + " | ".join(
                    _delta(servers, after, before, n) for n in ns) + " |")
    print(f"\nOf which the garbage collector, CPU µs per call (median over {args.reps} runs):\n")
    print("| variant | " + " | ".join(f"N={n}" for n in ns) + " |")
    print("|---" * (len(ns) + 1) + "|")
    for name in names:
        if name not in missing:
            print(f"| {_label(name)} | "
                  + " | ".join(f"{statistics.median(gcs[(name, n)]):,.1f}" for n in ns) + " |")
    if models:
        print("\nOf which the scripted model's `request`, CPU µs per call (median):\n")
        print("| variant | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---" * (len(ns) + 1) + "|")
        for name in names:
            if all((name, n) in models for n in ns):
                print(f"| {_label(name)} | " + " | ".join(
                    f"{statistics.median(models[(name, n)]):,.1f}" for n in ns) + " |")
    if len(ns) >= 2:
        print("\nGrowth (per-call cost at the largest N / at the smallest):")
        for name in names:
            if name not in missing:
                lo = statistics.median(times[(name, ns[0])])
                hi = statistics.median(times[(name, ns[-1])])
                print(f"- {_label(name)}: {hi / lo:.2f}x")
    print("\n## import time (ms, net of a bare interpreter; median)\n")
    for label, statement in IMPORTS.items():
        ms = _import_ms(statement, args.reps)
        print(f"- {label}: " + ("not installed" if ms is None else f"{ms:,.0f} ms"))


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
