"""Sessions: tokens, signed cookies, expiry, sign-out."""

from __future__ import annotations

from inbox_support import Inbox

from handrail.web._auth import Sessions, clean_user, csrf_ok


def test_sign_out_ends_the_session(inbox: Inbox) -> None:
    response = inbox.post("/logout")
    assert response.status_code == 303 and response.headers["location"] == "/login"
    assert inbox.client.get("/", follow_redirects=False).status_code == 303


def test_sign_out_needs_the_csrf_token(inbox: Inbox) -> None:
    assert inbox.post("/logout", csrf=False).status_code == 403
    assert inbox.client.get("/", follow_redirects=False).status_code == 200


def test_an_expired_session_is_nobody() -> None:
    sessions = Sessions(reusable={"a-long-team-token"}, lifetime=-1)
    session = sessions.login("a-long-team-token", "alice")
    assert session is not None
    assert sessions.from_cookie(sessions.cookie_value(session)) is None


def test_a_cookie_signed_by_another_process_is_nobody() -> None:
    mine, theirs = Sessions(one_time={"t1"}), Sessions(one_time={"t1"})
    session = theirs.login("t1", "alice")
    assert session is not None
    assert theirs.from_cookie(theirs.cookie_value(session)) == session
    assert mine.from_cookie(theirs.cookie_value(session)) is None
    assert mine.from_cookie("x" * 500) is None and mine.from_cookie(None) is None


def test_names_are_one_printable_line_and_an_empty_one_is_refused() -> None:
    assert clean_user("  bob\n\x1b[31m evil ") == "bob [31m evil"
    assert len(clean_user("x" * 500)) == 64
    assert Sessions(one_time={"t"}).login("t", " \n ") is None


def test_csrf_needs_the_exact_token() -> None:
    session = Sessions(one_time={"t"}).login("t", "alice")
    assert session is not None
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, None) and not csrf_ok(session, "") and \
        not csrf_ok(session, session.csrf + "x")
