"""The taint stage's cost per call at 10, 1,000 and 100,000 bytes of untrusted output seen.

Run: .venv/bin/python benchmarks/taint.py

The untrusted history is tool outputs of about 1 KB each (one output when there are fewer
bytes): English-like words, file paths, addresses and numbers from a fixed vocabulary, so
grams recur the way they do in real pages. A call has two protected arguments, an address
(20 characters: the substring path, then its domain, a part) and a short id (6 characters:
the exact path). Rows:

- the index (`Provenance.taint`), value absent (the common case: nothing to find);
- the index, value present in the oldest output;
- the index, a display-name mailbox and a URL, absent: each is cut into its parts
  (containment, issue 34: 2 and 6 lookups);
- the peer, measured in the same run: a rescan of the history per call (each stored output
  normalised again, then searched with `in`), which is what the index replaces;
- the history already normalised, searched with `in` (the cheapest rescan possible);
- indexing one output of 1 KB (paid once per call that returns one, at stage 9);
- the named-value rule (`Provenance.named`, issue 34 round five) for a mutating call of
  `page_update` with two one-token values, absent: the first word of its name (`page`) is
  in every URL of the history, so each output has sentences naming it (the worst case):
  once the outputs are scanned (every later call of that tool), and the first check of the
  tool in a run (it scans every output seen so far for its sentences: once per tool and
  output);
- the quotes of a final answer of 1 KB (`Provenance.quotes`, issue 34: about two lookups
  per word, once per run);
- the first lookup of a history: under 64 KB it is a `str.find` over the outputs joined;
  past that it builds the gram index of what is not yet indexed (once per 64 KB of new
  text), the cost a run pays only when a protected call looks a value up.

Figures are medians of repeats, in microseconds of this process's CPU time (not wall time:
on a shared machine a wall clock counts the time other processes held the core).

    valgrind --tool=callgrind .venv/bin/python benchmarks/taint.py --index-rounds N

indexes 8 outputs of 1 KB N times (each into a fresh `Provenance`, as the indexing row) and
prints nothing: two counts at two N give the instructions an output costs, which no load
moves (PYTHONPATH=SRC for another build).
"""

from __future__ import annotations

import random
import statistics
import time
import tracemalloc
import unicodedata
from collections.abc import Callable

from handrail.tools import Provenance

try:
    from handrail.tools import call_words
except ImportError:  # a tree before the named-value rule (a base to compare with)
    call_words = None

WORDS = ("the report quarterly send notes please review budget server deploy release "
         "src/app/main.py docs/readme.md alice@example.org 5,000 42 invoice account "
         "https://example.com/page?id=7 IMPORTANT update meeting draft final").split()


def history(total: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    outputs: list[str] = []
    size = min(1000, total)
    while sum(len(o) for o in outputs) < total:
        words: list[str] = ["ref77"]
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(WORDS) + str(rng.randrange(1000)))
        outputs.append(" ".join(words)[:size])
    return outputs


def median_us(fn: Callable[[], object], *, number: int = 200, repeat: int = 9) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            fn()
        times.append((time.process_time() - start) / number)
    return statistics.median(times) * 1e6


def norm(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def fill(outputs: list[str]) -> Provenance:
    prov = Provenance()
    for i, text in enumerate(outputs):
        prov.add_output((f"c{i}", "t"), {"content": [{"kind": "text", "text": text}]},
                        trusted=False)
    return prov


def main() -> None:
    sizes = (10, 1_000, 100_000)
    rows: dict[str, list[float]] = {}
    memory: list[float] = []
    for total in sizes:
        outputs = history(total)
        prov = Provenance()
        for i, text in enumerate(outputs):
            prov.add_output((f"c{i}", "web/fetch"), {"content": [{"kind": "text", "text": text}]},
                            trusted=False)
        prov.trust_text("task", "summarise the news and mail bob@example.org")
        absent = {"to": "mallory@evil.example", "id": "zq7x9w"}
        first = outputs[0].split()
        present = {"to": " ".join(first)[:20], "id": first[0]}
        protected = ["/to", "/id"]
        assert prov.taint(absent, protected) == []
        assert len(prov.taint(present, protected)) == 2, present
        rows.setdefault("index, values absent", []).append(
            median_us(lambda p=prov, a=absent, w=protected: p.taint(a, w)))
        rows.setdefault("index, values present (oldest output)", []).append(
            median_us(lambda p=prov, a=present, w=protected: p.taint(a, w)))
        # Containment (issue 34): a value not found whole has its parts looked up.
        parts = {"to": "Mallory <mallory@evil.example>",
                 "url": "https://evil.example:8443/collect/zq7x9w?d=report-2024"}
        assert prov.taint(parts, ["/to", "/url"]) == []
        rows.setdefault("index, a mailbox and a URL with parts, absent", []).append(
            median_us(lambda p=prov, a=parts: p.taint(a, ["/to", "/url"])))
        # Quotes (issue 34): a 1 KB final answer searched for spans of the history, once
        # per run; a few of its sentences copied from the oldest output.
        answer = " ".join(["Here is what I found for you today, in short."] * 16 +
                          [" ".join(first[:6])] * 3)[:1000]
        rows.setdefault("quotes of a 1 KB final answer (once per run)", []).append(
            median_us(lambda p=prov, a=answer: p.quotes(a), number=20))
        # The named-value rule (issue 34, round five): a mutating call's one-token values.
        if call_words is not None:
            stems = call_words("page_update")
            ids = {"page_id": "zq7x9w", "count": 123457}
            assert prov.named(stems, ids) == []
            rows.setdefault("named rule, a mutating call (outputs scanned)", []).append(
                median_us(lambda p=prov, a=ids, w=stems: p.named(w, a)))
            scans = []
            for _ in range(5):
                fresh = fill(outputs)
                start = time.process_time()
                fresh.named(stems, ids)
                scans.append((time.process_time() - start) * 1e6)
            rows.setdefault("named rule, the tool's first check (scans every output)",
                            []).append(statistics.median(scans))
        needle = norm(absent["to"])

        def rescan(o: list[str] = outputs, n: str = needle) -> bool:
            return any(n in norm(t) for t in o)

        normalised = [norm(t) for t in outputs]
        rows.setdefault("peer: rescan the history (normalise + `in`)", []).append(
            median_us(rescan, number=20 if total > 10_000 else 200))
        rows.setdefault("peer: `in` over the history already normalised", []).append(
            median_us(lambda h=normalised, n=needle: any(n in t for t in h)))
        one = {"content": [{"kind": "text", "text": history(1000, seed=1)[0]}]}
        rows.setdefault("index one more 1 KB output (stage 9)", []).append(
            median_us(lambda r=one: Provenance().add_output(("c", "t"), r, trusted=False),
                      number=200, repeat=15))
        # The lookup that finds more than 64 KB not yet in the gram index builds it (once per
        # 64 KB of new text): its cost, measured on fresh histories.
        built = []
        for _ in range(5):
            fresh = fill(outputs)
            start = time.process_time()
            fresh.taint(absent, protected)
            built.append((time.process_time() - start) * 1e6)
        rows.setdefault("the first lookup: builds the gram index past 64 KB (once)", []).append(
            statistics.median(built))
        tracemalloc.start()
        held = fill(outputs)
        held.taint(absent, protected)  # the index as a protected call leaves it
        memory.append(tracemalloc.get_traced_memory()[0] / 1024)
        tracemalloc.stop()

    print("| µs per call | " + " | ".join(f"{s:,} B seen" for s in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for name, values in rows.items():
        print(f"| {name} | " + " | ".join(f"{v:,.1f}" for v in values) + " |")
    print("| memory held by the index, KiB | " + " | ".join(f"{m:,.0f}" for m in memory) + " |")
    one_kb = rows["index one more 1 KB output (stage 9)"]
    print("\nindexing an output: " + ", ".join(f"{v / 1000:.3f} µs a byte" for v in one_kb)
          + " (the gram index, built by a lookup past 64 KB: "
          + ", ".join(f"{v / max(s, 1):.3f}" for v, s in zip(
              rows["the first lookup: builds the gram index past 64 KB (once)"], sizes,
              strict=True)) + " µs a byte of history)")
    scan_rows = rows.get("named rule, the tool's first check (scans every output)")
    if scan_rows:
        print("the named rule's scan: " + ", ".join(
            f"{v / max(s, 1):.3f}" for v, s in zip(scan_rows, sizes, strict=True))
            + " µs a byte of history (once per mutating tool and output)")
    index = rows["index, values absent"]
    peer = rows["peer: rescan the history (normalise + `in`)"]
    print("\nrescan / index (values absent): " + ", ".join(
        f"{p / i:,.1f}x at {s:,} B" for s, p, i in zip(sizes, peer, index, strict=True)))


def index_rounds(rounds: int) -> None:
    """Index 8 outputs of 1 KB `rounds` times, once first (for callgrind: see the module doc)."""
    outputs = [{"content": [{"kind": "text", "text": history(1000, seed=s)[0]}]}
               for s in range(1, 9)]
    for _ in range(rounds + 1):
        for output in outputs:
            Provenance().add_output(("c", "t"), output, trusted=False)


if __name__ == "__main__":
    import argparse

    import calibration

    with calibration.beside():
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--index-rounds", type=int, metavar="N",
                            help="only index 8 outputs N times, print nothing (callgrind)")
        rounds = parser.parse_args().index_rounds
        if rounds is None:
            main()
        elif rounds < 0:
            parser.error(f"--index-rounds takes a count of 0 or more, not {rounds}")
        else:
            index_rounds(rounds)
