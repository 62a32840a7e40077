"""How much work a backtracking regex engine does on a target: steps counted, not seconds.

`steps(regex, text)` runs `regex` (the subset of `re` syntax the policy's matcher compiles
to: literals, classes, `.`, greedy and lazy repeats, groups, atomic groups, lookahead, `\\Z`,
alternation) as Python's own engine does, a backtracking search in the same order, and counts
each character test and each position a repeat offers. Python's engine prunes more (literal
prefixes, fast scans), never less, so a count that grows linearly with the target bounds the
real engine's work the same way, on any machine, at any load: a test of "matching is linear"
that needs no clock. A backtracking translation of `*a*a*b` counts quadratically here, which
is what makes the test able to fail (`tests/policy/test_policy_matching.py`).
"""

from __future__ import annotations

import re._constants as C
import re._parser as P
from collections.abc import Iterator
from typing import Any

__all__ = ["Budget", "steps"]


class Budget(Exception):
    """The search took more steps than allowed (a superlinear pattern on a long target)."""


class _Engine:
    def __init__(self, text: str, limit: int) -> None:
        self.text = text
        self.n = len(text)
        self.steps = 0
        self.limit = limit

    def tick(self) -> None:
        self.steps += 1
        if self.steps > self.limit:
            raise Budget(self.steps)

    # One character: LITERAL, NOT_LITERAL, ANY, IN. None when `item` is not one character.
    def char(self, op: Any, av: Any, i: int) -> bool | None:
        if op is C.LITERAL:
            self.tick()
            return i < self.n and ord(self.text[i]) == av
        if op is C.NOT_LITERAL:
            self.tick()
            return i < self.n and ord(self.text[i]) != av
        if op is C.ANY:
            self.tick()
            return i < self.n  # DOTALL: the policy's regexes are compiled with it
        if op is C.IN:
            self.tick()
            return i < self.n and _in(av, ord(self.text[i]))
        return None

    def seq(self, items: list[Any], k: int, i: int) -> Iterator[int]:
        if k == len(items):
            yield i
            return
        for j in self.item(items[k], i):
            yield from self.seq(items, k + 1, j)

    def item(self, item: Any, i: int) -> Iterator[int]:
        op, av = item
        one = self.char(op, av, i)
        if one is not None:
            if one:
                yield i + 1
            return
        if op is C.SUBPATTERN:
            yield from self.seq(list(av[3]), 0, i)
        elif op is C.ATOMIC_GROUP:
            for j in self.seq(list(av), 0, i):
                yield j  # the first way through, and no other: never backtracked into
                return
        elif op is C.ASSERT or op is C.ASSERT_NOT:
            direction, sub = av
            assert direction == 1, "lookbehind is not used by the policy's matcher"
            found = any(True for _ in self.seq(list(sub), 0, i))
            if found == (op is C.ASSERT):
                yield i
        elif op is C.AT:
            self.tick()
            if av is C.AT_END_STRING and i == self.n:
                yield i
            elif av is C.AT_BEGINNING_STRING and i == 0:
                yield i
            elif av not in (C.AT_END_STRING, C.AT_BEGINNING_STRING):
                raise AssertionError(f"unsupported anchor {av}")
        elif op is C.BRANCH:
            for alternative in av[1]:
                yield from self.seq(list(alternative), 0, i)
        elif op is C.MAX_REPEAT or op is C.MIN_REPEAT:
            yield from self.repeat(av, i, greedy=op is C.MAX_REPEAT)
        else:
            raise AssertionError(f"unsupported regex operation {op}")

    def repeat(self, av: Any, i: int, *, greedy: bool) -> Iterator[int]:
        low, high, sub = av
        sub = list(sub)
        if len(sub) == 1 and sub[0][0] in (C.LITERAL, C.NOT_LITERAL, C.ANY, C.IN):
            # One character repeated. Greedy: scan the whole run, then offer each end from
            # the longest. Lazy: offer the shortest, and test one more character each time
            # the rest of the pattern asks for a longer one (as Python's engine does).
            op, arg = sub[0]
            run = 0
            while run < low:
                if not self.char(op, arg, i + run):
                    return
                run += 1
            if greedy:
                while (high is C.MAXREPEAT or run < high) and self.char(op, arg, i + run):
                    run += 1
                for j in range(i + run, i + low - 1, -1):
                    self.tick()
                    yield j
                return
            while True:
                self.tick()
                yield i + run
                if (high is not C.MAXREPEAT and run >= high) or not self.char(op, arg, i + run):
                    return
                run += 1
        yield from self._repeat(sub, low, high, 0, i, greedy)

    def _repeat(self, sub: list[Any], low: int, high: Any, count: int, i: int,
                greedy: bool) -> Iterator[int]:
        more = high is C.MAXREPEAT or count < high
        if not greedy and count >= low:
            yield i
        if more:
            for j in self.seq(sub, 0, i):
                if j == i and count >= low:
                    continue  # an empty iteration would repeat forever
                yield from self._repeat(sub, low, high, count + 1, j, greedy)
        if greedy and count >= low:
            yield i


def _in(items: Any, code: int) -> bool:
    negate = False
    hit = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            hit = hit or code == av
        elif op is C.RANGE:
            hit = hit or av[0] <= code <= av[1]
        else:
            raise AssertionError(f"unsupported class item {op}")
    return hit != negate


def steps(regex: str, text: str, *, limit: int = 10**7) -> tuple[bool, int]:
    """(whether `regex` fully matches `text`, the steps a backtracking engine took).

    Raises:
        Budget: more than `limit` steps.
    """
    engine = _Engine(text, limit)
    items = list(P.parse(regex))
    matched = any(j == engine.n for j in engine.seq(items, 0, 0))
    return matched, engine.steps
