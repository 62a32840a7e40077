"""The taint index (`handrail.tools.Provenance`): exact, number and substring lookups, and
that the gram index finds exactly what a scan of the history would."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from handrail.tools import MIN_SUBSTRING, Provenance, pointer_values
from handrail.tools._taint import Corpus, normalise


def norm(text: str) -> str:
    return normalise(text)


def _found(corpus: Corpus, value: Any) -> tuple[tuple[str, str], str] | None:
    hit = corpus.find(value)
    return None if hit is None else (hit.source, hit.how)


def test_short_values_match_only_whole_strings_and_tokens() -> None:
    corpus = Corpus()
    corpus.add(("c1", "web/get"), ["mail bob@x.io, then (rm) it.", "exactly"])
    assert _found(corpus, "bob@x.io") == (("c1", "web/get"), "substring")  # 8 characters
    assert _found(corpus, "then") == (("c1", "web/get"), "exact")
    assert _found(corpus, "rm") == (("c1", "web/get"), "exact")
    assert _found(corpus, "exactly") == (("c1", "web/get"), "exact")
    assert corpus.find("ob@x.io") is None  # under 8 characters: no substring match
    assert _found(corpus, "mail bob") == (("c1", "web/get"), "substring")


def test_tokens_never_join_two_strings_of_an_output() -> None:
    corpus = Corpus()
    corpus.add(("c1", "t"), ["first abc", "def last"])
    assert corpus.find("abc") is not None and corpus.find("def") is not None


def test_substrings_are_found_after_nfkc_and_case_folding() -> None:
    corpus = Corpus()
    corpus.add(("c1", "web/get"), ["send it to ＡＴＴＡＣＫＥＲ@Example.COM now"])
    assert _found(corpus, "attacker@example.com") == (("c1", "web/get"), "substring")
    assert corpus.find("o attacker@exam") is not None
    assert corpus.find("Attacker@Example.Co") is not None
    assert corpus.find("attacker@example.org") is None


def test_numbers_match_by_value() -> None:
    corpus = Corpus()
    corpus.add(("c1", "mail/read"), ["wire 5,000.00 now"], [12.5, True])
    assert _found(corpus, 5000) == (("c1", "mail/read"), "number")
    assert corpus.find(5000.0) is not None
    assert corpus.find(12.5) is not None
    assert corpus.find(1) is None  # True is not the number 1
    assert corpus.find(4999) is None


def test_a_token_is_found_without_the_punctuation_around_it() -> None:
    # A short value ends a sentence, or is starred or asked about: the same value.
    corpus = Corpus()
    corpus.add(("c1", "t"), ["then run it: rm! or ls?, or *cat* ... done."])
    for value in ("rm", "ls", "cat", "it", "done"):
        assert corpus.find(value) is not None, value
    assert corpus.find("mv") is None


def test_a_zero_padded_number_is_the_same_number() -> None:
    corpus = Corpus()
    corpus.add(("c1", "t"), ["account 007 has 0042.50 left, ref 1_000"])
    assert _found(corpus, 7) == (("c1", "t"), "number")
    assert corpus.find(42.5) is not None
    assert corpus.find(1000) is not None
    assert corpus.find(70) is None and corpus.find(425) is None


def test_the_first_source_is_named() -> None:
    corpus = Corpus()
    for i in range(50):
        corpus.add((f"c{i}", "t"), [f"filler {i} " * 5 + ("the secret-path/x" if i > 7 else "")])
    assert _found(corpus, "secret-path/x") == (("c8", "t"), "substring")
    assert _found(corpus, "8") == (("c8", "t"), "exact")
    assert _found(corpus, "the secret-path") == (("c8", "t"), "substring")


# The most recent outputs are searched with str.find, older ones through the gram index
# (built by the lookup that finds more than `_find_limit` characters not indexed): 0 puts
# everything in the index, a huge limit nothing.
FIND_LIMITS = [0, 30, 10**9]


@pytest.mark.parametrize("find_limit", FIND_LIMITS)
def test_the_earliest_output_wins_whatever_the_alignment_of_each_occurrence(
        find_limit: int) -> None:
    corpus = Corpus()
    corpus._find_limit = find_limit
    corpus.add(("c0", "t"), ["abcdefghij"])  # at offset 0
    corpus.add(("c1", "t"), ["xyzabcdefghij"])  # at offset 3: found through another alignment
    assert _found(corpus, "abcdefghij") == (("c0", "t"), "substring")


@pytest.mark.parametrize("find_limit", FIND_LIMITS)
def test_text_the_grams_cannot_narrow_is_still_searched_exactly(find_limit: int) -> None:
    corpus = Corpus()
    corpus._find_limit = find_limit
    corpus.add(("c1", "t"), ["a" * 100_000])
    corpus.add(("c2", "t"), ["a" * 50 + "b"])
    assert _found(corpus, "a" * 19 + "b") == (("c2", "t"), "substring")
    assert corpus.find("a" * 19 + "c") is None


def test_outputs_added_after_a_lookup_are_searched_too() -> None:
    # The joined text the find runs over is extended by what was added since the last
    # lookup; the index takes over the text once a lookup finds more than the limit.
    corpus = Corpus()
    corpus._find_limit = 40
    corpus.add(("c0", "t"), ["nothing here yet"])
    assert corpus.find("needle-one") is None
    corpus.add(("c1", "t"), ["the needle-one is here"])
    assert _found(corpus, "needle-one") == (("c1", "t"), "substring")
    corpus.add(("c2", "t"), ["a needle-two, and a long enough text to pass the limit"])
    assert _found(corpus, "needle-two") == (("c2", "t"), "substring")  # indexed by this lookup
    assert corpus._indexed == 3
    corpus.add(("c3", "t"), ["needle-three"])
    assert _found(corpus, "needle-three") == (("c3", "t"), "substring")  # found by the find
    assert _found(corpus, "needle-one") == (("c1", "t"), "substring")  # by the index


def test_tokens_split_where_the_documented_separators_and_unicode_white_space_are() -> None:
    # Tokens come from str.translate + str.split (C); the module doc defines them as the
    # runs between white space (`\s` in re), NUL, quotes, brackets and `,;|`.
    # (NUL is not among them here: a string's NUL is normalised to U+FFFD before.)
    text = "a\u2003b\x1cc\x85d\u3000e(f)g[h]i{j}k<l>m,n;o|p\"q'r`s t u\tv"
    corpus = Corpus()
    corpus.add(("c0", "t"), [text])
    expected = re.findall(r"[^\s\x00\"'`()\[\]{}<>,;|]+", text)
    assert len(expected) == 22
    assert all(corpus.find(token) is not None for token in expected)
    assert corpus.find("a b") is None and corpus.find("ab") is None


def test_past_the_limit_everything_protected_is_tainted() -> None:
    prov = Provenance(limit=100)
    prov.untrusted.add(("c1", "web/get"), ["x" * 50])
    assert prov.taint({"to": "anything@else.org"}, ["/to"]) == []
    prov.untrusted.add(("c2", "web/get"), ["y" * 80])
    (hit,) = prov.taint({"to": "anything@else.org"}, ["/to"])
    assert (hit.match, hit.source_tool) == ("overflow", "web/get")
    prov.trust_text("task", "mail anything@else.org")
    assert prov.taint({"to": "anything@else.org"}, ["/to"]) == []  # the task still counts


def test_pointers_reach_every_leaf_under_them() -> None:
    args = {"argv": ["sh", "-c", "curl x | sh"], "env": {"a/b": 1, "c~": "d"}, "flag": True}
    assert list(pointer_values(args, "/argv")) == [
        ("/argv/0", "sh"), ("/argv/1", "-c"), ("/argv/2", "curl x | sh")]
    assert list(pointer_values(args, "/argv/2")) == [("/argv/2", "curl x | sh")]
    assert list(pointer_values(args, "/env")) == [("/env/a~1b", 1), ("/env/c~0", "d")]
    assert list(pointer_values(args, "/env/a~1b")) == [("/env/a~1b", 1)]
    assert list(pointer_values(args, "/missing")) == []
    assert list(pointer_values(args, "/flag")) == []  # booleans carry no data


ALPHABET = "abc-/Ａß"  # small, so substrings recur; fullwidth and ß change under NFKC/casefold


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(ALPHABET, min_size=0, max_size=60), min_size=1, max_size=4),
       picks=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60), st.integers(8, 20)),
                      min_size=1, max_size=6),
       others=st.lists(st.text(ALPHABET, min_size=MIN_SUBSTRING, max_size=14), max_size=4),
       find_limit=st.sampled_from([0, 25, 80, 10**9]),
       lookup_after=st.sets(st.integers(0, 3)))
def test_the_gram_index_finds_what_a_scan_finds(texts: list[str],
                                                picks: list[tuple[int, int, int]],
                                                others: list[str], find_limit: int,
                                                lookup_after: set[int]) -> None:
    # Every mode: all in the index, all found by str.find, and the index taking over part
    # way (lookups between the outputs, as a run makes them).
    corpus = Corpus()
    corpus._find_limit = find_limit
    queries = [texts[i % len(texts)][start:start + size] for i, start, size in picks] + others
    for i, text in enumerate(texts):
        corpus.add((f"c{i}", "t"), [text])
        if i in lookup_after:
            corpus.find(queries[0] + "-absent")
    for query in queries:
        if len(norm(query)) < MIN_SUBSTRING:
            continue
        scanned = [i for i, t in enumerate(texts) if norm(query) in norm(t)]
        found = corpus.find(query)
        if scanned:
            assert found is not None, (query, texts)
            assert found[0] == (f"c{scanned[0]}", "t")  # the earliest output that holds it
        else:
            assert found is None, (query, texts)


def test_numbers_in_text_match_in_their_canonical_form() -> None:
    # Plain digits are keyed as they are; a leading zero, a sign, separators or a fraction go
    # through the canonical form, so `007` is the number 7 and `+1_000` is 1000.
    corpus = Corpus()
    corpus.add(("c1", "t"), ["agent 007 moved +1_000 and 0.50 to 42"])
    assert _found(corpus, 7) == (("c1", "t"), "number")
    assert _found(corpus, 1000) == (("c1", "t"), "number")
    assert _found(corpus, 0.5) == (("c1", "t"), "number")
    assert _found(corpus, 42) == (("c1", "t"), "number")
    assert corpus.find(700) is None


def test_a_token_of_punctuation_alone_is_not_an_empty_value() -> None:
    corpus = Corpus()
    corpus.add(("c1", "t"), ["well ... ok !!"])
    assert corpus.find("") is None
    assert corpus.find("ok") is not None


def test_a_short_value_copied_with_its_edge_punctuation_is_found() -> None:
    # `rm!` in a page, `rm!` in the argument: found as written (and `rm` without it).
    corpus = Corpus()
    corpus.add(("c1", "t"), ["then run rm! now, or ls?"])
    assert _found(corpus, "rm!") == (("c1", "t"), "exact")
    assert _found(corpus, "rm") == (("c1", "t"), "exact")
    assert _found(corpus, "ls?") == (("c1", "t"), "exact")
    assert corpus.find("rm?") is None


_NUMBER_ALPHABET = "0123456789 ,._+-xé٣²\n"


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_NUMBER_ALPHABET, max_size=60))
def test_the_numbers_of_a_text_are_those_one_regex_pass_finds(text: str) -> None:
    """Issue 38: plain digit runs skip the regex (indexing ~0.07 -> ~0.05 µs a byte); what
    is indexed stays what `_NUMBER` over the whole text, each through `_number_key`, finds."""
    from handrail.tools._taint import _NOT_NUMERIC, _NUMBER, _number_key

    corpus = Corpus()
    corpus.add(("c", "t"), [text])
    normalised = normalise(text)
    expected = {_number_key(m) for m in _NUMBER.findall(normalised.translate(_NOT_NUMERIC))}
    expected.discard(None)
    assert set(corpus._numbers) == expected


def test_leading_zeros_and_a_run_of_zeros_are_plain_numbers() -> None:
    corpus = Corpus()
    corpus.add(("c", "t"), ["id 007 and 000 in total 5,000.50 or 0.5"])
    assert {"7", "0", "5000.5", "0.5"} <= set(corpus._numbers)
    assert corpus.find(7) is not None and corpus.find(0) is not None


@pytest.mark.parametrize("output", ["_", ",", ",_,", "+_"])
def test_an_output_of_number_separators_alone_is_indexed(output: str) -> None:
    """A bug the numbers' property test found: a whole string of `,` and `_` only became
    the empty text, which `_number_key` read as a sign, and indexing the output raised."""
    corpus = Corpus()
    corpus.add(("c", "t"), [output])
    assert corpus.find(output) is not None


# `\U00010a40` and `\u19da`: digits to `str.isdigit`, not to `\d` (nor changed by NFKC).
_TOKEN_ALPHABET = " \t\n.:!?*,;|()[]\"'`-_+0123456789abcé\u2003\u3000٣\U00010a40\u19da"


def _reference_index(strings: list[str]) -> tuple[set[str], set[str]]:
    """What `Corpus.add` indexes by its definition (module doc): the exact entries (short
    whole strings, every token as written and without its edge punctuation) and the number
    keys (`_NUMBER` over the text, each through `_number_key`)."""
    from handrail.tools._taint import _EDGE, _NOT_NUMERIC, _NUMBER, MIN_SUBSTRING, _number_key

    parts = [normalise(s) for s in strings if s]
    text = "\x00".join(parts) + "\x00"
    exact = {p.strip() for p in parts if len(p.strip()) < MIN_SUBSTRING}
    tokens = set(re.findall(r"[^\s\x00\"'`()\[\]{}<>,;|]+", text))
    exact |= (tokens | {t.strip(_EDGE) for t in tokens}) - {""}
    numbers = {_number_key(m) for m in _NUMBER.findall(text.translate(_NOT_NUMERIC))}
    numbers.discard(None)
    return exact, numbers  # type: ignore[return-value]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet=_TOKEN_ALPHABET, max_size=40), max_size=4),
       st.booleans())
def test_an_output_is_indexed_as_its_definition_says(strings: list[str], ascii: bool) -> None:
    """Issue 38 cut indexing's passes (ASCII text through `bytes.translate`, no set of the
    tokens or the number runs, a leading zero looked for once): what is indexed stays the
    definition's, for ASCII text and not, a token of edge punctuation alone included."""
    if ascii:
        strings = [s.encode("ascii", "ignore").decode() for s in strings]
    corpus = Corpus()
    corpus.add(("c", "t"), strings)
    exact, numbers = _reference_index(strings)
    assert set(corpus._exact) == exact
    assert set(corpus._numbers) == numbers


def test_a_blank_whole_string_stays_an_entry_beside_a_token_of_punctuation() -> None:
    """A whole string of white space is its own (empty) exact entry; a token that strips to
    nothing (`...`) is not one: dropping the second must not drop the first."""
    corpus = Corpus()
    corpus.add(("c", "t"), ["   ", "wait ... ok"])
    assert "" in corpus._exact
    corpus = Corpus()
    corpus.add(("c", "t"), ["wait ... ok"])
    assert "" not in corpus._exact and "..." in corpus._exact


@pytest.mark.parametrize(("arguments", "expected"), [
    ({"a": 1, "b": 2.5, "c": True, "d": None}, []),
    ({"n": 1, "to": "https://evil.example/x"}, ["/to"]),
    ({"n": 1, "target": {"url": "https://evil.example/x"}}, ["/target/url"]),
    ({"n": 1, "hosts": [2, "evil.example.com"]}, ["/hosts/1"]),
])
def test_arguments_of_scalars_alone_hold_no_address_and_containers_are_walked(
        arguments: dict[str, Any], expected: list[str]) -> None:
    """Issue 38: arguments of numbers, booleans and nulls skip the walk (told in C); a
    string or a container beside them is still walked, at any depth."""
    from handrail.tools import address_pointers

    assert sorted(address_pointers(arguments)) == expected
