"""The session's state moves only as the one transition table allows (core/states.py)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from applier.apply.core.states import (
    IDLE,
    PREPARE,
    STREAM,
    TRANSITIONS,
    TXN,
    IllegalTransition,
    State,
    check_move,
)
from applier.apply.handlers.dispatch import Applier
from applier.config import config_from_dict
from applier.errors import ProtocolError
from applier.lsn import Lsn
from applier.protocol import Begin, Commit, Prepare


def _applier() -> Applier:
    cfg = config_from_dict(
        {
            "source": {"dsn": "host=x", "publications": ["p"]},
            "target": {"dsn": "host=y", "origin": "o"},
        }
    )
    session: Any = SimpleNamespace(in_txn=False, on_missing=None, txn_context={})
    catalog: Any = SimpleNamespace(conn=None)
    return Applier(cfg, session, catalog, None, Lsn(0))  # type: ignore[arg-type]


def test_the_table_allows_the_moves_the_handlers_make_and_no_other() -> None:
    allowed = {(f, t) for f, tos in TRANSITIONS.items() for t in tos}
    assert allowed == {
        (IDLE, IDLE), (IDLE, TXN), (IDLE, PREPARE), (IDLE, STREAM),
        (TXN, IDLE), (TXN, STREAM),
        (PREPARE, IDLE),
        (STREAM, IDLE), (STREAM, TXN),
    }  # fmt: skip
    for frm, to in itertools.product(State, State):
        if (frm, to) in allowed:
            assert check_move(frm, to) is to
        else:
            with pytest.raises(IllegalTransition) as e:
                check_move(frm, to)
            assert (e.value.frm, e.value.to) == (frm, to)
            assert f"from {frm.value} to {to.value}" in str(e.value)


def test_the_applier_moves_through_the_table_and_refuses_an_illegal_move() -> None:
    a = _applier()
    a.move(PREPARE)
    assert a.state is PREPARE
    with pytest.raises(IllegalTransition, match="from in prepared transaction to in stream"):
        a.move(STREAM)
    assert a.state is PREPARE  # an illegal move leaves the state as it was
    a.move(IDLE)
    assert a.state is IDLE


def test_a_message_in_the_wrong_state_is_still_the_streams_error_not_ours() -> None:
    """The dispatch table refuses it before any handler could try an illegal move."""
    a = _applier()
    with pytest.raises(ProtocolError, match="unexpected prepare message while idle"):
        a.dispatch(Lsn(5), Prepare(0, Lsn(1), Lsn(2), 0, 7, "g"))
    a.dispatch(Lsn(5), Begin(Lsn(100), 0, 1))
    assert a.state is TXN
    with pytest.raises(ProtocolError, match="while in transaction"):
        a.dispatch(Lsn(6), Begin(Lsn(200), 0, 2))
    a.dispatch(Lsn(7), Commit(0, Lsn(100), Lsn(110), 0))
    assert a.state is IDLE
