"""Policy.check cost per call at 10, 1,000 and 10,000 rules.

Run: .venv/bin/python benchmarks/policy.py

Rules are a realistic mix: directory trees (`src/pkg17/**`), extensions (`*.ext17`), exact
files, mid-path globs (`docs/v3/**/*.md`, `**/cache9/*`), tool ids, argv prefixes and hosts,
spread over every act and every effect. READ paths are timed through `check` (which
canonicalises: one `realpath`, an lstat per path component) and, separately, the matcher alone
on an already canonical path and the canonicalisation alone. Every row but the last empties
the policy's verdict memo before each check, so it is the cost of a target seen for the first
time; the "again" rows are a target checked again (an agent calling the same tool: the
path's resolution and the PATH lookup kept while nothing they read on disk changed, then the
verdict memo). Figures are medians of repeats, in microseconds per call.
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
MAKERS: list[Callable[[int], tuple[hr.Act, str]]] = [
    lambda i: (hr.Act.WRITE, f"src/pkg{i}/**"),
    lambda i: (hr.Act.READ, f"*.ext{i}"),
    lambda i: (hr.Act.READ, f"data/set{i}/part-*.csv"),
    lambda i: (hr.Act.WRITE, f"docs/v{i}/**/*.md"),
    lambda i: (hr.Act.READ, f"config/file{i}.yaml"),
    lambda i: (hr.Act.CALL, f"server{i}/tool_*"),
    lambda i: (hr.Act.CALL, f"ledger/op{i}"),
    lambda i: (hr.Act.EXEC, f"tool{i} **"),
    lambda i: (hr.Act.NET, f"*.host{i}.example.com"),
    lambda i: (hr.Act.READ, f"**/cache{i}/*"),
]


def make_policy(n: int) -> Policy:
    rules = [Rule(*MAKERS[i % len(MAKERS)](i), EFFECTS[i % 3]) for i in range(n)]
    size = max(1, n // 5)
    return Policy(tuple(Layer(f"layer{k}", tuple(rules[k : k + size])) for k in range(0, n, size)))


def median_us(fn: Callable[[], object], *, number: int = 2000, repeat: int = 9) -> float:
    fn()  # warm up (the first check compiles the policy)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - start) / number)
    return statistics.median(times) * 1e6


def main() -> None:
    sizes = (10, 1_000, 10_000)
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = workspace_root(tmp)
        os.makedirs(os.path.join(root, "src", "pkg3", "sub"))
        path = "src/pkg3/sub/mod.py"
        with open(os.path.join(root, path), "w"):
            pass  # an existing file four deep
        messy = "./src//pkg3/sub/../sub/mod.py"
        # The policy is compiled once per root; a matcher-only run uses "/" as the workspace
        # and an absolute path that realpath resolves in a single component.
        for n in sizes:
            policy = make_policy(n)
            # CPU time: a one-off, which a shared machine's load would otherwise decide.
            start = time.process_time()
            policy.check(hr.Action(hr.Act.CALL, "a/b"))
            rows.setdefault("compile, once (CPU ms)", []).append(
                (time.process_time() - start) * 1e3
            )
            cases: dict[str, tuple[hr.Action, str]] = {
                "call, matched": (hr.Action(hr.Act.CALL, "ledger/op6"), root),
                "call, default": (hr.Action(hr.Act.CALL, "other/tool"), root),
                "exec, default": (hr.Action(hr.Act.EXEC, ("git", "commit", "-m", "x")), root),
                "net, default": (hr.Action(hr.Act.NET, "api.github.com:443"), root),
                "read, matcher only": (hr.Action(hr.Act.READ, "/x"), "/"),
                "read, full check": (hr.Action(hr.Act.READ, path), root),
                "read messy, full check": (hr.Action(hr.Act.READ, messy), root),
            }
            memo = policy._compiled.memo  # type: ignore[attr-defined]
            for label, (action, ws) in cases.items():
                # Each check as if its target were new: the verdict memo is emptied first, so
                # these rows are the matcher's own cost.
                rows.setdefault(label, []).append(
                    median_us(
                        lambda a=action, w=ws, p=policy, m=memo: (
                            m.clear(),
                            p.check(a, workspace=w),
                        )  # type: ignore[misc]
                    )
                )
            # Checked again (an agent calling the same tool): canonicalisation kept while
            # nothing it read on disk changed, then the verdict memo.
            for label, key in (
                ("call, same target again (memo)", "call, default"),
                ("exec, same argv again", "exec, default"),
                ("read, same path again", "read, full check"),
            ):
                action = cases[key][0]
                rows.setdefault(label, []).append(
                    median_us(lambda a=action, p=policy: p.check(a, workspace=root))  # type: ignore[misc]
                )
        rows["canonicalise only (kept)"] = [
            median_us(lambda: canonical_path(path, root)) for _ in sizes
        ]
        # The machine's calibration, in the same run: one system call and realpath itself.
        full = os.path.join(root, path)
        rows["calibration: os.lstat"] = [median_us(lambda: os.lstat(full)) for _ in sizes]
        rows["calibration: os.path.realpath"] = [
            median_us(lambda: os.path.realpath(full)) for _ in sizes
        ]
    print(f"{'median µs per check':32}" + "".join(f"{n:>14,} rules" for n in sizes))
    for label, values in rows.items():
        print(f"{label:32}" + "".join(f"{v:>20.2f}" for v in values))
    base = rows["call, default"]
    print(f"{'ratio to 10 rules (call)':32}" + "".join(f"{v / base[0]:>20.2f}" for v in base))


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
