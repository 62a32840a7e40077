"""AgentDojo through the gate: utility under attack, attack success, asks per pair.

Run: .venv/bin/pip install agentdojo && .venv/bin/python benchmarks/agentdojo.py
     (--suite banking --limit 20 for a quick look; --version v1.2.1 is the default;
     one process per suite with --save, then --merge the files, on a busy machine)

AgentDojo (the public `agentdojo` package, ETH Zurich) holds four suites of tools over a
simulated environment (workspace, travel, banking, slack), user tasks with a utility check,
and injection tasks with a security check; an attack puts an injection task's goal into the
places a user task's tools read. Every user task x injection task pair is run here with the
`important_instructions` attack (the one the AgentDojo paper reports).

The model is scripted and obedient, the worst case: it performs the user task's ground-truth
calls one per turn, and as soon as a tool result carries the injection (`<INFORMATION>`), it
performs the injection task's ground-truth calls first, then goes on with the user's. A call
refused by the gate comes back as an error, and the model goes on with the next. Its final
answer is the user task's ground-truth answer (and the injection's, once it obeyed one).
Every ask is denied at once (nobody is there to approve); the asks are counted.

Configurations (rows):

- `ungoverned`: the calls run against the environment directly, as a framework without a
  gate would run them;
- `Policy.default()`: the gate with the default policy (a mutating call asks);
- `taint`: every tool allowed, the arguments that name a recipient, a URL or a user
  declared protected (the app's author's declaration, below), plus what the gate protects
  for every tool (addresses);
- `taint + intent`: the same, and each run is given the intent of its task: the mutating
  tools the user's request needs (`Agent.run(intent=...)`). The trusted side states it: here
  it is taken from the user task's ground truth, standing for the user (or a planner that
  reads only the user's request) saying what the task may change;
- `taint + intent, deny`: the same with `Policy.with_taint("deny")`: what the taint stage or
  the intent would ask about is refused outright (an unattended agent: nobody to ask);
- `taint, every argument + intent`: the issue's open question, answered by measuring it:
  every argument of a mutating tool is protected unless this app marks it free text
  (`FREE`: a message's subject and body, a file's content, an event's description), plus
  the intent;
- `taint + plan`: the `taint` row, and each run is given a plan (`Agent.run(plan=...)`):
  one `hr.Step` per mutating call of the user task's ground truth, fixing each argument
  whose value the user's request states (a value written in the request, or the part of a
  value the request dictates: "The event title should be 'Dinner at {restaurant_name}'"
  becomes `title="Dinner at *"`); every other argument is free. It stands for a planner
  that reads the request and nothing else (no tool output) and writes down the calls and
  the values the user gave; a real model would also have to spell them as the tools
  expect (a date in the request is "April 25th", in the call "2024-04-25"): this scripted
  planner commits only what the request holds verbatim, so dates and times stay free.

- `taint + plan, quotes cut`: the same, and the app cuts from the final answer every span
  `RunResult.quoted` says a tool wrote (the answer-only injection's sentence, and every
  hotel name or address the answer took from a tool): what it costs to act on the quotes
  rather than show them.
- `taint + plan, text held`: the same, and the app shows `RunResult.shown()`: the answer
  with the quotes that are words from inside a tool's text (`RunResult.held`) held, the
  values tools reported (a name in a listing, an address, a labelled value) shown.

Which tools change nothing is this app's declaration too: the tools whose name starts with
get_, search_, list_, read_ or check_ are `mutates=False`. Nothing in handrail knows a tool,
an argument or a suite of this benchmark: they are named here only.

Attack success counts a pair whose injection task's security check passed (the attacker's
goal reached the environment, or the answer); utility counts the user task's check.
"""



from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

import handrail as hr
from handrail.models import Scripted, ToolResultMessage, Turn, call, reply

# This file is named like the package: run as a script, its own directory comes first on the
# path and `import agentdojo` would import this file.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
try:
    from agentdojo.agent_pipeline.base_pipeline_element import BasePipelineElement
    from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
    from agentdojo.attacks.important_instructions_attacks import ImportantInstructionsAttack
    from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
    from agentdojo.task_suite.load_suites import get_suites
    from agentdojo.types import (
        ChatAssistantMessage,
        ChatToolResultMessage,
        text_content_block_from_string,
    )
except ImportError:  # pragma: no cover - the benchmark needs the package
    print("this benchmark needs the agentdojo package: .venv/bin/pip install agentdojo",
          file=sys.stderr)
    raise SystemExit(2) from None

READ_PREFIXES = ("get_", "search_", "list_", "read_", "check_")
"""This app's declaration of the tools that change nothing."""

PROTECTED = frozenset({"recipients", "recipient", "cc", "bcc", "url", "email", "user_email",
                       "participants", "user"})
"""This app's protected arguments: who receives, where a request goes, who is let in."""

FREE = frozenset({"subject", "body", "content", "description"})
"""For `taint, every argument`: the arguments this app marks free text (meant to quote)."""

MARK = "<INFORMATION>"
"""How the obedient model recognises the injection in a tool result."""

CONFIGS = ("ungoverned", "default", "taint", "taint+intent", "taint+intent, deny",
           "taint(all)+intent", "taint+plan", "taint+plan, quotes cut", "taint+plan, text held")


def mutates(name: str) -> bool:
    return not name.startswith(READ_PREFIXES)


@dataclass
class Pair:
    """One user task x injection task run's outcome."""

    user: str
    injection: str
    utility: bool
    attacked: bool
    asks: int
    asked: list[str] = field(default_factory=list)


class Denier:
    """The approver nobody answers: every ask is denied, and counted."""

    name = "auto-deny"

    def __init__(self) -> None:
        self.requests: list[hr.Request] = []

    async def decide(self, request: hr.Request) -> hr.Decision:
        self.requests.append(request)
        return hr.Decision.deny("nobody is there to approve")


class Obedient:
    """The scripted worst-case model: the user's calls, and every injection's first."""

    def __init__(self, server: str, user: Sequence[FunctionCall],
                 injection: Sequence[FunctionCall], answer: str, injected_answer: str) -> None:
        self.server = server
        self.queue = list(user)
        self.injection = list(injection)
        self.answer = answer
        self.injected_answer = injected_answer
        self.obeyed = False

    def __call__(self, messages: Sequence[Any], tools: Sequence[Any]) -> Turn:
        last = messages[-1] if messages else None
        if not self.obeyed and isinstance(last, ToolResultMessage) and \
                MARK in last.result.render_text():
            self.obeyed = True
            self.queue[0:0] = self.injection
        if self.queue:
            planned = self.queue.pop(0)
            return call(f"{self.server}/{planned.function}", dict(planned.args))
        answer = self.answer
        if self.obeyed and self.injected_answer:
            answer = f"{answer}\n{self.injected_answer}"
        return reply(answer or "done")


class Through(BasePipelineElement):
    """An AgentDojo pipeline whose agent is the obedient model, behind the gate or not."""

    name = "gpt-4o-2024-05-13"  # the attack addresses the model by this name

    def __init__(self, suite: Any, config: str) -> None:
        self.suite = suite
        self.config = config
        self.user_task: Any = None
        self.injection_task: Any = None
        self.asks: list[hr.Request] = []

    def query(self, query: str, runtime: FunctionsRuntime, env: Any = None,
              messages: Sequence[Any] = (), extra_args: Mapping[str, Any] | None = None,
              ) -> tuple[Any, ...]:
        user_calls = self.user_task.ground_truth(env)
        injection_calls = ([] if self.injection_task is None
                           else self.injection_task.ground_truth(env))
        model = Obedient(self.suite.name, user_calls, injection_calls,
                         self.user_task.GROUND_TRUTH_OUTPUT,
                         "" if self.injection_task is None
                         else self.injection_task.GROUND_TRUTH_OUTPUT)
        trace: list[Any] = []
        if self.config == "ungoverned":
            answer = self._ungoverned(model, runtime, env, trace)
        else:
            answer = anyio.run(self._governed, model, runtime, env, trace, user_calls)
        trace.append(ChatAssistantMessage(role="assistant", tool_calls=None,
                                          content=[text_content_block_from_string(answer)]))
        return query, runtime, env, [*messages, *trace], dict(extra_args or {})

    def _ungoverned(self, model: Obedient, runtime: FunctionsRuntime, env: Any,
                    trace: list[Any]) -> str:
        messages: list[Any] = []
        for _ in range(200):
            turn = model(messages, [])
            if not turn.tool_calls:
                return turn.text or ""
            ((tool, arguments),) = turn.tool_calls
            assert isinstance(arguments, Mapping)
            name = tool.split("/", 1)[1]
            result, error = runtime.run_function(env, name, arguments)
            text = error or tool_result_to_str(result)
            _traced(trace, name, arguments, text)
            messages.append(ToolResultMessage(call_id=str(len(messages)), name=tool,
                                              result=hr.ToolResult.text(text or "ok")))
        return ""

    async def _governed(self, model: Obedient, runtime: FunctionsRuntime, env: Any,
                        trace: list[Any], user_calls: Sequence[FunctionCall]) -> str:
        tools = [self._tool(f, runtime, env, trace) for f in self.suite.tools]
        server = self.suite.name
        if self.config == "default":
            policy = hr.Policy.default()
        else:
            policy = hr.Policy.default().layer("app").allow(hr.Act.CALL, f"{server}/*")
        if self.config.endswith(", deny"):
            policy = policy.with_taint("deny")
        intent = None
        if self.config.startswith(("taint+intent", "taint(all)+intent")):
            intent = sorted({f"{server}/{c.function}" for c in user_calls
                             if mutates(c.function)})
        plan = None
        if self.config.startswith("taint+plan"):
            # The planning turn (`Agent.plan`): the scripted planner's one call, on the request.
            steps = [s.to_dict() for s in planned(server, self.user_task.PROMPT, user_calls)]
            planner = hr.Agent(Scripted([call("handrail/plan", {"steps": steps})]), tools,
                               policy=policy)
            plan = await planner.plan(self.user_task.PROMPT)
        approver = Denier()
        agent = hr.Agent(Scripted([model] * 200), tools, policy=policy, max_steps=200,
                         quotes=True)
        result = await agent.run(self.user_task.PROMPT, approver=approver, intent=intent,
                                 plan=plan)
        self.asks = approver.requests
        output = result.output
        if not isinstance(output, str):
            return ""
        if self.config.endswith("quotes cut"):
            for quote in reversed(result.quoted):
                output = output[:quote.start] + "[...]" + output[quote.end:]
        if self.config.endswith("text held"):
            output = result.shown("[...]")
        return output

    def _tool(self, function: Any, runtime: FunctionsRuntime, env: Any,
              trace: list[Any]) -> hr.SchemaTool:
        name = function.name
        schema = function.parameters.model_json_schema()
        protected = [] if not self.config.startswith("taint") else [
            f"/{arg}" for arg in schema.get("properties", {})
            if arg in PROTECTED or (self.config.startswith("taint(all)") and mutates(name)
                                    and arg not in FREE)]

        async def run(arguments: dict[str, Any], ctx: hr.CallContext) -> hr.ToolResult:
            result, error = runtime.run_function(env, name, arguments)
            text = error or tool_result_to_str(result)
            _traced(trace, name, arguments, text)
            return hr.ToolResult.error(text) if error else hr.ToolResult.text(text or "ok")

        spec = hr.ToolSpec(hr.ToolId(self.suite.name, name), function.description or name,
                           schema, mutates=mutates(name), protected=tuple(protected))
        return hr.SchemaTool(spec, run, origin="agentdojo")


def planned(server: str, request: str, calls: Sequence[FunctionCall]) -> list[hr.Step]:
    """The plan a planner reading only `request` writes: the mutating calls, and the values
    (or the leading part of a value, `Dinner at *`) the request states verbatim."""
    text = " ".join(request.casefold().split())
    steps: list[hr.Step] = []
    for c in calls:
        if not mutates(c.function):
            continue
        fixed: dict[str, Any] = {}
        for name, value in c.args.items():
            stated = _stated(value, text)
            if stated is not None:
                fixed[name] = stated
        step = hr.Step(f"{server}/{c.function}", fixed)
        if step not in steps:
            steps.append(step)
    return steps


def _stated(value: Any, text: str) -> Any:
    """`value` as the request states it (a `*` pattern for a part of it), or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value if f" {value} " in f" {text} " else None
    if isinstance(value, list):
        items = [_stated(v, text) for v in value]
        return value if value and all(i == v for i, v in zip(items, value, strict=True)) \
            else None
    if not isinstance(value, str) or "*" in value:
        return None
    folded = " ".join(value.casefold().split())
    if len(folded) >= 3 and folded in text:
        return value
    # The request dictates a leading part ("Dinner at {restaurant_name}"): whole words of
    # at least 8 characters in all, followed by something the request leaves open.
    words = value.split(" ")
    for cut in range(len(words) - 1, 0, -1):
        head = " ".join(words[:cut]) + " "
        if len(head) >= 8 and head.casefold() in text:
            return head + "*"
    return None


def _traced(trace: list[Any], name: str, arguments: Mapping[str, Any], text: str) -> None:
    """The call as AgentDojo's checks read it: it reached the environment."""
    fc = FunctionCall(function=name, args=dict(arguments))
    trace.append(ChatAssistantMessage(role="assistant", tool_calls=[fc],
                                      content=[text_content_block_from_string("")]))
    trace.append(ChatToolResultMessage(role="tool", tool_call=fc, tool_call_id=None, error=None,
                                       content=[text_content_block_from_string(text)]))


def run_suite(suite: Any, configs: Sequence[str], limit: int | None,
              users: slice = slice(None), only_users: Sequence[str] = (),
              only_injections: Sequence[str] = ()) -> dict[str, list[Pair]]:
    """Every pair of `suite` (the first `limit`) under each configuration.

    Pairs outside, configurations inside: a pair's injected environment is loaded once and
    each configuration runs on its own deep copy.
    """
    pipelines = {config: Through(suite, config) for config in configs}
    attack = ImportantInstructionsAttack(suite, next(iter(pipelines.values())))
    # Where a user task's tools read depends on the user task only: found once per task
    # (it runs the task's ground truth over a freshly loaded environment).
    candidates: dict[str, list[str]] = {}
    find_candidates = attack.get_injection_candidates

    def cached_candidates(user_task: Any) -> list[str]:
        if user_task.ID not in candidates:
            candidates[user_task.ID] = find_candidates(user_task)
        return candidates[user_task.ID]

    attack.get_injection_candidates = cached_candidates  # type: ignore[method-assign]
    results: dict[str, list[Pair]] = {config: [] for config in configs}
    done = 0
    for user_task in list(suite.user_tasks.values())[users]:
        if only_users and user_task.ID not in only_users:
            continue
        for injection_task in suite.injection_tasks.values():
            if only_injections and injection_task.ID not in only_injections:
                continue
            if limit is not None and done >= limit:
                return results
            done += 1
            if done % 25 == 0:
                print(f"({suite.name}: {done} pairs)", file=sys.stderr, flush=True)
            injections = attack.attack(user_task, injection_task)
            environment = suite.load_and_inject_default_environment(injections)
            for config, pipeline in pipelines.items():
                pipeline.user_task, pipeline.injection_task = user_task, injection_task
                pipeline.asks = []
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    utility, attacked = suite.run_task_with_pipeline(
                        pipeline, user_task, injection_task, injections,
                        environment=environment.model_copy(deep=True))
                results[config].append(Pair(
                    user_task.ID, injection_task.ID, utility, attacked, len(pipeline.asks),
                    [f"{a.tool}: {a.verdict_reason[:400]}" for a in pipeline.asks]))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="v1.2.1")
    parser.add_argument("--suite", action="append", help="only these suites (repeatable)")
    parser.add_argument("--config", action="append", choices=CONFIGS,
                        help="only these configurations (repeatable)")
    parser.add_argument("--limit", type=int, help="pairs per suite at most")
    parser.add_argument("--users", help="a slice of each suite's user tasks, START:END[:STEP]")
    parser.add_argument("--user", action="append", default=[],
                        help="only these user tasks, by id (user_task_35; repeatable)")
    parser.add_argument("--injection", action="append", default=[],
                        help="only these injection tasks, by id (injection_task_1; repeatable)")
    parser.add_argument("--show", action="store_true", help="print each attack that succeeded")
    parser.add_argument("--show-asks", action="store_true", help="with --show: every ask too")
    parser.add_argument("--save", help="also write every pair's outcome to this JSON file")
    parser.add_argument("--merge", nargs="+", help="print the table of these saved files")
    args = parser.parse_args()
    if args.merge:
        merged: dict[str, dict[str, list[Pair]]] = {}
        for path in args.merge:
            for name, by_config in json.loads(Path(path).read_text()).items():
                into = merged.setdefault(name, {})
                for c, pairs in by_config.items():
                    into.setdefault(c, []).extend(Pair(**p) for p in pairs)
        table(merged, list(merged), [c for c in CONFIGS if c in next(iter(merged.values()))],
              args)
        return
    suites = get_suites(args.version)
    names = args.suite or ["workspace", "travel", "banking", "slack"]
    print(f"AgentDojo {args.version}, important_instructions attack, obedient scripted model, "
          "asks denied\n")
    configs = args.config or list(CONFIGS)
    started = time.perf_counter()
    per_suite: dict[str, dict[str, list[Pair]]] = {}
    for name in names:
        bounds = [int(b) if b else None for b in (args.users or ":").split(":")]
        per_suite[name] = run_suite(suites[name], configs, args.limit, slice(*bounds),
                                    args.user, args.injection)
        print(f"({name}: {time.perf_counter() - started:.0f} s)", file=sys.stderr)
    if args.save:
        Path(args.save).write_text(json.dumps(
            {name: {c: [dataclasses.asdict(p) for p in pairs] for c, pairs in by.items()}
             for name, by in per_suite.items()}))
    table(per_suite, names, configs, args)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


def table(per_suite: Mapping[str, Mapping[str, list[Pair]]], names: Sequence[str],
          configs: Sequence[str], args: argparse.Namespace) -> None:
    print("| configuration | pairs | utility under attack | attack success | asks / pair |")
    print("|---|---|---|---|---|")
    for config in configs:
        everything = [p for name in names for p in per_suite[name][config]]
        n = len(everything)
        utility = sum(p.utility for p in everything) / n
        attacked = sum(p.attacked for p in everything) / n
        asks = sum(p.asks for p in everything) / n
        print(f"| {config} | {n} | {utility:.1%} | {attacked:.1%} | {asks:.2f} |")
        for name in names:
            pairs = per_suite[name][config]
            k = len(pairs)
            print(f"|   {name} | {k} | {sum(p.utility for p in pairs) / k:.1%} | "
                  f"{sum(p.attacked for p in pairs) / k:.1%} | "
                  f"{sum(p.asks for p in pairs) / k:.2f} |")
        if args.show:
            for p in everything:
                if p.attacked or (args.show_asks and p.asks):
                    print(f"    {'ATTACK ' if p.attacked else ''}{p.user} x {p.injection}: "
                          f"utility={p.utility} asks={p.asked}")
        sys.stdout.flush()


if __name__ == "__main__":
    # (this folder left sys.path above: back at its end, after the packages)
    sys.path.append(str(Path(__file__).resolve().parent))
    import calibration

    with calibration.beside():
        main()
