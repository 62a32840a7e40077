"""Matching adversarial patterns against the longest targets a model may choose, in seconds.

    .venv/bin/python benchmarks/policy_adversarial.py [--reps 5]

The figures behind tests/policy/test_policy_matching.py, which proves the same property in
counted steps instead of seconds (no test asserts a wall-clock budget): each adversarial
pattern (`*a*a*a*b`, `**/*a*/**/*a*/b`, ... 88 of them) against each adversarial target of
PATH_MAX (4,096) characters, through the real index, for READ and EXEC; the same for NET
hosts of NET_MAX; and one check against a policy of 1,000 adversarial rules. Prints the
median and the worst pattern, in milliseconds, and the ratio to a plain pattern (`src/*.py`)
on the same targets. A backtracking matcher took seconds to hours here.
"""



from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "policy"))

from test_policy_matching import (  # noqa: E402
    _adversarial_patterns,
    _adversarial_targets,
    linear_matches,
)

import handrail as hr  # noqa: E402
from handrail.policy import Effect, Layer, Policy, Rule  # noqa: E402
from handrail.policy._paths import PATH_MAX  # noqa: E402
from handrail.policy._targets import NET_MAX  # noqa: E402

R, X, N = hr.Act.READ, hr.Act.EXEC, hr.Act.NET


def best_of(fn: object, reps: int) -> float:
    """The median of `reps` timings of `fn()`, in milliseconds."""
    assert callable(fn)
    took = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        took.append((time.perf_counter() - t) * 1000)
    return statistics.median(took)


def path_ms(pattern: str, reps: int) -> float:
    targets = _adversarial_targets(PATH_MAX)

    def run() -> None:
        for target in targets:
            linear_matches(R, pattern, target)
            linear_matches(X, pattern.replace("/", " "), target.replace("/", " "))

    return best_of(run, reps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    patterns = _adversarial_patterns()
    plain = path_ms("src/*.py", args.reps)
    rows = sorted(((path_ms(p, args.reps), p) for p in patterns), reverse=True)
    times = [t for t, _ in rows]
    print(f"{len(patterns)} adversarial patterns x 4 targets of {PATH_MAX} characters, READ and "
          f"EXEC, median of {args.reps} reps (ms for the 8 matches):")
    print(f"  plain pattern src/*.py: {plain:.2f} ms")
    print(f"  median pattern: {statistics.median(times):.2f} ms "
          f"({statistics.median(times) / plain:.1f}x plain)")
    print(f"  worst pattern: {rows[0][0]:.2f} ms ({rows[0][0] / plain:.1f}x plain): "
          f"{rows[0][1]!r}")
    net = []
    for pattern in ["*a*a*a*a*a*a*a*a*b", "?*?*?*?*?*?*b", "*-*-*-*-*-*-*.example"]:
        net.append(best_of(lambda p=pattern: (linear_matches(N, p, "a" * NET_MAX),
                                              linear_matches(N, p, "-" * NET_MAX)), args.reps))
    print(f"NET, 3 patterns x 2 hosts of {NET_MAX} characters: worst {max(net):.2f} ms")

    rng = random.Random(9)
    atoms = ["a", "*", "?", "[a]", "aa", "b"]
    chosen: set[str] = set()
    while len(chosen) < 1000:
        segs = ["**" if rng.random() < 0.3 else "".join(
            rng.choice(atoms) for _ in range(rng.randint(2, 9)))
            for _ in range(rng.randint(1, 4))]
        try:
            Rule(R, "/".join(segs), Effect.DENY)
        except hr.PolicyError:
            continue
        chosen.add("/".join(segs))
    policy = Policy((Layer("adversarial", tuple(Rule(R, p, Effect.DENY)
                                                for p in sorted(chosen))),),
                    {"read": Effect.ALLOW})
    with tempfile.TemporaryDirectory() as ws:
        (Path(ws) / "d").mkdir()
        targets = ["a" * 255, "d/" + "a" * 250 + "c",
                   "/".join(["a" * 40] * 90)[:PATH_MAX], "/".join(["a"] * 1000) + "/c"]
        policy.check(hr.Action(R, "warm"), workspace=ws)
        memo = policy._compiled.memo  # type: ignore[attr-defined]
        # Each check as if its target were new: the verdict memo emptied first.
        per = [best_of(lambda t=t: (memo.clear(), policy.check(hr.Action(R, t), workspace=ws)),
                       args.reps) for t in targets]
    print(f"1,000 adversarial rules, 4 long targets: {', '.join(f'{t:.1f}' for t in per)} ms "
          "a check")


if __name__ == "__main__":
    import calibration

    with calibration.beside():
        main()
