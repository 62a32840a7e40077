"""`new_batch`: the loop's `Batch(run=run)` without the dataclass `__init__` (issue 38)."""

import dataclasses

from handrail.store import Batch, RunRecord
from handrail.store.contract import new_batch


def test_a_new_batch_is_the_constructors_batch() -> None:
    run = RunRecord(id="r1", task="t")
    assert new_batch() == Batch()
    assert new_batch(run) == Batch(run=run)
    assert new_batch(run).run is run
    made = new_batch()
    for f in dataclasses.fields(Batch):  # every field set: none left unset on the slot
        getattr(made, f.name)


def test_each_new_batch_has_lists_of_its_own() -> None:
    """A list shared between two batches would write one turn's records with the next's."""
    first, second = new_batch(), new_batch()
    for f in dataclasses.fields(Batch):
        if f.name != "run":
            assert getattr(first, f.name) is not getattr(second, f.name), f.name
            assert getattr(first, f.name) == [], f.name
    first.calls.append("x")  # type: ignore[arg-type]
    first.claims.append("y")  # type: ignore[arg-type]
    assert second.calls == [] and second.claims == [] and new_batch().calls == []
