"""The runs' tests start their programs (killable.py, resumable.py, ...) as forks of one server
that has imported handrail (tests/tools/forks.py): stopped here at the end of the session."""

from collections.abc import Iterator

import forks
import pytest


@pytest.fixture(scope="session", autouse=True)
def _shared_fork_server() -> Iterator[None]:
    yield
    forks.stop_shared()
