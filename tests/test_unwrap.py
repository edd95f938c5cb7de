"""Exception groups unwrapped to the exception that says why (labd.errors.unwrap): however
deeply nested, a bug before an expected fault, a cancellation last."""

from __future__ import annotations

import asyncio

from labd.errors import LinkDown, unwrap


def test_a_nested_group_gives_its_leaf() -> None:
    lost = LinkDown("MQTT: gone")
    nested = ExceptionGroup("outer", [ExceptionGroup("inner", [lost])])
    assert unwrap(nested, (LinkDown,)) is lost
    assert unwrap(lost) is lost


def test_a_bug_beside_an_expected_fault_is_not_lost() -> None:
    bug = KeyError("h9")
    group = ExceptionGroup("session", [LinkDown("gone"), ExceptionGroup("x", [bug])])
    assert unwrap(group, (LinkDown,)) is bug


def test_a_cancellation_is_the_answer_only_where_nothing_else_is() -> None:
    cancelled = asyncio.CancelledError()
    lost = LinkDown("gone")
    assert unwrap(BaseExceptionGroup("g", [cancelled, lost]), (LinkDown,)) is lost
    assert unwrap(BaseExceptionGroup("g", [cancelled])) is cancelled
