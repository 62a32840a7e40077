"""Requests, decisions, the built-in approvers and responders."""

from __future__ import annotations

import io
import json
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

import handrail as hr
import handrail.approval as approval
import handrail.policy as policy_pkg
from handrail.approval import (
    Approve,
    ApproveAll,
    Approver,
    CallbackApprover,
    Decision,
    Defer,
    Deny,
    DenyAll,
    FixedResponder,
    Request,
    Responder,
    ResponderNone,
    StdinApprover,
    StdinResponder,
)
from handrail.errors import PolicyError, UserError
from handrail.policy import Effect, Rule

pytestmark = pytest.mark.anyio


def make_request(**overrides: object) -> Request:
    fields: dict[str, object] = {
        "act": hr.Act.WRITE, "target": "src/app.py", "content": b"new\n",
        "tool": "local/write_file", "arguments": {"path": "src/app.py", "text": "new\n"},
        "call_id": "call-1", "agent": "coder",
    }
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


def test_exports_are_pinned() -> None:
    assert set(approval.__all__) == {
        "Approve", "ApproveAll", "Approver", "CallableControl", "CallbackApprover",
        "CommandControl", "Control", "ControlVerdict", "Decision", "Defer", "Deny",
        "DenyAll", "FixedResponder", "Question", "Request", "Responder", "ResponderNone",
        "StdinApprover", "StdinResponder", "adjudicate", "control_from",
        "kill_running_controls", "DELIVERY_HEADER", "SIGNATURE_HEADER", "DecisionLinks",
        "LinkClaim", "Notification", "Notifier", "WebhookNotifier", "WebhookVerifier", "clean",
        "default_backoff", "sign", "verify_signature"}
    assert set(policy_pkg.__all__) == {
        "CONFINEMENT", "SECRETS", "Act", "Action", "AskTerms", "parse_duration", "Effect",
        "Layer", "OutsideWorkspace",
        "Policy", "Rule", "UncanonicalPath", "UncanonicalTarget", "Verdict", "canonicalize",
        "resolve_in_workspace", "MAX_NESTING", "PATH_MAX", "address_classes", "canonical_net",
        "canonical_path", "is_inside", "resolve_program", "too_deep", "without_bom",
        "workspace_root", "Flip", "Suggestion", "WhatIf", "replay", "suggest", "suggest_from",
        "what_if"}
    for module in (approval, policy_pkg):
        assert all(hasattr(module, name) for name in module.__all__)
    assert approval.Question is hr.Question


def test_request_round_trips_with_bytes() -> None:
    request = make_request(
        content=b"\x00\xffbinary", run_id="run-1", workspace="/ws",
        actions=(hr.Action(hr.Act.WRITE, "src/app.py", b"\x00\xffbinary"),
                 hr.Action(hr.Act.EXEC, ("git", "add", "."))),
        verdict_reason="default for write",
    )
    data = json.loads(json.dumps(request.to_dict()))
    assert Request.from_dict(data) == request
    assert make_request().id != make_request().id
    with pytest.raises(UserError, match="unknown request key"):
        Request.from_dict({**data, "extra": 1})
    with pytest.raises(UserError, match="lacks the key 'tool'"):
        Request.from_dict({k: v for k, v in data.items() if k != "tool"})


def test_decisions() -> None:
    remember = ["src/**", Rule("read", "x", "ask")]
    approve = Decision.approve(modified={"path": "b"}, remember=remember)
    assert isinstance(approve, Approve) and approve.modified == {"path": "b"}
    assert approve.remember_rules(hr.Act.WRITE) == [
        Rule(hr.Act.WRITE, "src/**", Effect.ALLOW), Rule(hr.Act.READ, "x", Effect.ASK)]
    with pytest.raises(PolicyError):
        Decision.approve(remember=["a**"]).remember_rules("write")
    deny = Decision.deny("not on Fridays")
    assert isinstance(deny, Deny) and deny.reason == "not on Fridays"
    with pytest.raises(UserError, match="reason"):
        Decision.deny("  ")
    assert isinstance(Decision.defer(), Defer)
    for d in (approve, deny, Decision.defer(), Decision.approve()):
        assert Decision.from_dict(json.loads(json.dumps(d.to_dict()))) == d
    with pytest.raises(UserError, match="not a decision"):
        Decision.from_dict({"kind": "maybe"})


async def test_builtin_approvers() -> None:
    request = make_request()
    assert isinstance(await ApproveAll().decide(request), Approve)
    denied = await DenyAll("no humans today").decide(request)
    assert isinstance(denied, Deny) and denied.reason == "no humans today"
    callback = CallbackApprover(lambda r: Decision.defer())
    for a in (ApproveAll(), DenyAll(), StdinApprover(), callback):
        assert isinstance(a, Approver)


async def test_callback_approver_sync_async_and_checked() -> None:
    seen: list[str] = []

    def sync(request: Request) -> Decision:
        seen.append(request.target)
        return Decision.deny("sync")

    async def asynchronous(request: Request) -> Decision:
        await anyio.lowlevel.checkpoint()
        return Decision.approve()

    assert isinstance(await CallbackApprover(sync).decide(make_request()), Deny)
    assert isinstance(await CallbackApprover(sync, blocking=True).decide(make_request()), Deny)
    assert isinstance(await CallbackApprover(asynchronous).decide(make_request()), Approve)
    assert seen == ["src/app.py", "src/app.py"]
    with pytest.raises(UserError, match="must return"):
        await CallbackApprover(lambda r: True).decide(make_request())  # type: ignore[arg-type,return-value]


async def test_stdin_approver_shows_a_diff_and_needs_y(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("old\n")
    request = make_request(workspace=str(tmp_path), content=b"new\n\x1b[2Jhidden\n")
    out = io.StringIO()
    decision = await StdinApprover(input=io.StringIO("y\n"), output=out).decide(request)
    assert isinstance(decision, Approve)
    shown = out.getvalue()
    assert "write src/app.py" in shown and "-old" in shown and "+new" in shown
    assert "\x1b" not in shown and "\\x1b[2Jhidden" in shown  # escapes cannot restyle
    assert "Approve? [y/N/a]" in shown
    for answer in ("n\n", "yep\n", "yes\n", "\n"):
        d = await StdinApprover(input=io.StringIO(answer), output=io.StringIO()).decide(request)
        assert isinstance(d, Deny) and d.reason == "denied by the operator", answer
    # The reason a person types is the one the model reads.
    d = await StdinApprover(input=io.StringIO("n\nnot in src\n"),
                            output=io.StringIO()).decide(request)
    assert isinstance(d, Deny) and d.reason == "not in src"
    # "a": approved, and the same write allowed for the rest of the run.
    d = await StdinApprover(input=io.StringIO("a\n"), output=io.StringIO()).decide(request)
    assert isinstance(d, Approve) and d.remember == ("src/app.py",)
    # End of input: nobody there; deferred, never denied in a person's name.
    d = await StdinApprover(input=io.StringIO(""), output=io.StringIO()).decide(request)
    assert d.kind == "defer"


async def test_stdin_approver_new_file_and_binary(tmp_path: Path) -> None:
    out = io.StringIO()
    await StdinApprover(input=io.StringIO("n\n"), output=out).decide(
        make_request(workspace=str(tmp_path), target="new.txt", content=b"hello\n"))
    assert "/dev/null" in out.getvalue() and "+hello" in out.getvalue()
    out = io.StringIO()
    await StdinApprover(input=io.StringIO("n\n"), output=out).decide(
        make_request(workspace=str(tmp_path), target="b.bin", content=b"\x00\x01"))
    assert "binary content" in out.getvalue()


async def test_stdin_approver_does_not_block_the_loop(tmp_path: Path) -> None:
    class SlowInput(io.StringIO):
        def __init__(self, reading: anyio.Event, released: anyio.Event) -> None:
            super().__init__()
            self.reading, self.released = reading, released

        def readline(self, size: int | None = -1) -> str:  # type: ignore[override]
            anyio.from_thread.run_sync(self.reading.set)
            anyio.from_thread.run(self.released.wait)
            return "y\n"

    reading, released = anyio.Event(), anyio.Event()
    approver = StdinApprover(input=SlowInput(reading, released), output=io.StringIO())
    result: list[Decision] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            async def decide() -> None:
                result.append(await approver.decide(make_request(workspace=str(tmp_path))))
            tg.start_soon(decide)
            # The reader waits for its line; the loop still runs this task meanwhile (a
            # reader on the loop would hold it, and nothing would release the line).
            await reading.wait()
            released.set()
    assert isinstance(result[0], Approve)


async def test_responders() -> None:
    q = hr.Question("Which account?", context="two match", choices=["savings", "checking"])
    assert await ResponderNone().answer(q) is None
    assert await FixedResponder("checking").answer(q) == "checking"
    for r in (ResponderNone(), FixedResponder("x"), StdinResponder()):
        assert isinstance(r, Responder)
    cases = {"2\n": "checking", "1\n": "savings", "\n": None, "": None,
             "the joint one\n": "the joint one", "7\n": "7"}
    for line, expected in cases.items():
        out = io.StringIO()
        got = await StdinResponder(input=io.StringIO(line), output=out).answer(q)
        assert got == expected, line
        assert "1. savings" in out.getvalue() and "two match" in out.getvalue()


async def test_allow_for_this_run_is_offered_only_for_an_exact_target() -> None:
    """A glob character in a target would make "allow for this run" allow more than was
    shown; an argv is never turned into a pattern."""
    for request in (make_request(target="src/*.py"), make_request(target="src/[ab].py"),
                    make_request(act=hr.Act.EXEC, target="git status", content=None,
                                 actions=(hr.Action(hr.Act.EXEC, ("git", "status")),))):
        out = io.StringIO()
        d = await StdinApprover(input=io.StringIO("a\n"), output=out).decide(request)
        assert isinstance(d, Deny), request.target
        assert "[y/N/a]" not in out.getvalue() and "[y/N]" in out.getvalue()


async def test_an_edit_file_request_shows_the_edit_as_a_diff(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("alpha\nbeta\nalpha beta\n")
    edit = make_request(tool="workspace/edit_file", target="notes.txt", content=None,
                        workspace=str(tmp_path),
                        arguments={"path": "notes.txt", "old": "alpha\nbeta",
                                   "new": "alpha\ngamma"})
    out = io.StringIO()
    await StdinApprover(input=io.StringIO("n\n"), output=out).decide(edit)
    assert "-beta" in out.getvalue() and "+gamma" in out.getvalue()
    # `old` occurring twice (overlaps counted, as edit_file counts them): the edit will be
    # refused, and no diff pretends otherwise.
    twice = make_request(tool="workspace/edit_file", target="notes.txt", content=None,
                         workspace=str(tmp_path),
                         arguments={"path": "notes.txt", "old": "alpha", "new": "x"})
    out = io.StringIO()
    await StdinApprover(input=io.StringIO("n\n"), output=out).decide(twice)
    assert "no diff" in out.getvalue() and "more than once" in out.getvalue()
    assert "+x" not in out.getvalue()
    (tmp_path / "overlap.txt").write_text("aaa\n")  # "aa" occurs twice, overlapping
    overlap = make_request(tool="workspace/edit_file", target="overlap.txt", content=None,
                           workspace=str(tmp_path),
                           arguments={"path": "overlap.txt", "old": "aa", "new": "b"})
    out = io.StringIO()
    await StdinApprover(input=io.StringIO("n\n"), output=out).decide(overlap)
    assert "no diff" in out.getvalue() and "+ba" not in out.getvalue()
