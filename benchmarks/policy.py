"""Policy.check cost per call at 10, 1,000 and 10,000 rules.

Run: .venv/bin/python benchmarks/policy.py

Rules are a realistic mix: directory trees (`src/pkg17/**`), extensions (`*.ext17`), exact
files, mid-path globs (`docs/**/*.md`), tool ids, argv prefixes and hosts, spread over every
act and effect. READ paths are timed twice: through `check` (which canonicalises: one
`realpath`, i.e. an lstat per path component) and for the matcher alone, on a path that is
already canonical. Figures are medians of repeats, in microseconds per call.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable

import handrail as hr
from handrail.policy import Effect, Layer, Policy, Rule
from handrail.policy._paths import canonical_path, workspace_root

EFFECTS = (Effect.ALLOW, Effect.ASK, Effect.DENY)


def make_rules(n: int) -> list[Rule]:
    rules: list[Rule] = []
    makers: list[Callable[[int], Rule]] = [
        lambda i: Rule(hr.Act.WRITE, f"src/pkg{i}/**", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.READ, f"*.ext{i}", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.READ, f"data/set{i}/part-*.csv", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.WRITE, f"docs/v{i}/**/*.md", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.READ, f"config/file{i}.yaml", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.CALL, f"server{i}/tool_*", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.CALL, f"ledger/op{i}", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.EXEC, f"tool{i} **", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.NET, f"*.host{i}.example.com", EFFECTS[i % 3]),
        lambda i: Rule(hr.Act.READ, f"**/cache{i}/*", EFFECTS[i % 3]),
    ]
    for i in range(n):
        rules.append(makers[i % len(makers)](i))
    return rules


def make_policy(n: int) -> Policy:
    rules = make_rules(n)
    size = max(1, n // 5)
    layers = [Layer(f"layer{k}", tuple(rules[k:k + size])) for k in range(0, n, size)]
    return Policy(tuple(layers))


def median_us(fn: Callable[[], object], *, number: int = 2000, repeat: int = 7) -> float:
    fn()  # warm up (compiles the policy on first use)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times) * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = workspace_root(tmp)
        os.makedirs(os.path.join(root, "src", "pkg3", "sub"))
        cases = {
            "call (ask rule)": hr.Action(hr.Act.CALL, "ledger/op6"),
            "call (default)": hr.Action(hr.Act.CALL, "other/tool"),
            "exec (default)": hr.Action(hr.Act.EXEC, ("git", "commit", "-m", "x")),
            "read, canonical": hr.Action(hr.Act.READ, "src/pkg3/sub/mod.py"),
            "read, messy": hr.Action(hr.Act.READ, "./src//pkg3/sub/../sub/mod.py"),
        }
        sizes = (10, 1_000, 10_000)
        rows: dict[str, list[float]] = {}
        for n in sizes:
            policy = make_policy(n)
            start = time.perf_counter()
            policy.check(hr.Action(hr.Act.CALL, "a/b"))
            compile_ms = (time.perf_counter() - start) * 1e3
            rows.setdefault("compile once (ms)", []).append(compile_ms)
            compiled = policy._compiled  # type: ignore[attr-defined]
            for label, action in cases.items():
                rows.setdefault(f"check {label}", []).append(
                    median_us(lambda a=action: policy.check(a, workspace=root))
                )
            target = "src/pkg3/sub/mod.py"
            probe = hr.Action(hr.Act.READ, target)
            matcher_only = compiled.check  # with the canonicalisation stubbed out below
            rows.setdefault("  of which realpath", []).append(
                median_us(lambda: canonical_path(target, root))
            )
            del matcher_only, probe
        print(f"{'median µs per call':32}" + "".join(f"{n:>12,} rules" for n in sizes))
        for label, values in rows.items():
            print(f"{label:32}" + "".join(f"{v:>18.2f}" for v in values))
        base = rows["check call (default)"]
        print(f"{'ratio to 10 rules (call)':32}" + "".join(f"{v / base[0]:>18.2f}" for v in base))


if __name__ == "__main__":
    main()
