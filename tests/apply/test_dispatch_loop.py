"""The worker's dispatch loop in C (``dispatch_batch``) does what its Python twin does.

``Worker._dispatch`` hands a batch to ``dispatch_batch`` (applier/speedups/
dispatch.c), which calls a message's handler itself on Applier.dispatch's
common path and the dispatch method for anything else. Generated batches of
messages, handlers that change the state, start a live transaction, ask to
stop or raise: the C loop and its Python twin (dispatch.py) with the real
``Applier.dispatch`` must make the same calls, in the same order, stop at the
same message and raise the same error. The end-to-end apply tests run the C
loop (and ``test_apply_group`` both loops) on real servers.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from applier import speedups
from applier.apply.batchdispatch import open_state_of
from applier.apply.core.states import IDLE, STREAM, TXN, State
from applier.apply.handlers.dispatch import Applier
from applier.errors import ProtocolError
from applier.lsn import Lsn
from applier.protocol import Begin
from applier.speedups import dispatch as py_dispatch

pytestmark = pytest.mark.skipif(
    speedups.IMPLEMENTATION != "C", reason="pure Python (APPLIER_PURE_PYTHON, or not built)"
)


class A:
    kind = "A"


class B:
    kind = "B"


class C:  # no handler: Applier.dispatch's ProtocolError
    kind = "C"


def _begin() -> Begin:  # one of the messages that drop a live transaction first
    return Begin(Lsn(1), 0, 1)


class Boom(Exception):
    pass


#: What a handler does after it is logged: nothing, set a state, start or end a
#: live transaction, ask the worker to stop, or raise.
ACTIONS = ["none", "idle", "txn", "stream", "live", "unlive", "stop", "raise"]


class Harness:
    """Applier.dispatch's real code on a minimal object; handlers that log."""

    def __init__(self, actions: dict[str, list[str]], loop: str = "c") -> None:
        self.state: State = IDLE
        self.live: Any = None
        #: What the Worker passes: the stop request (its ``stopping``).
        self.stop = (speedups.Flag if loop == "c" else py_dispatch.Flag)()
        self.until = None
        self.applier = self
        self.log: list[tuple[Any, ...]] = []
        self.actions = {k: list(v) for k, v in actions.items()}
        self.handlers = {
            A: (frozenset({IDLE, TXN}), self._handler("A")),
            B: (frozenset({TXN, STREAM}), self._handler("B")),
            Begin: (frozenset({IDLE, TXN}), self._handler("Begin")),
        }

    def _handler(self, name: str) -> Any:
        def handle(lsn: int, msg: Any) -> None:
            self.log.append((name, lsn, self.state, self.live is not None))
            todo = self.actions.setdefault(name, [])
            action = todo.pop(0) if todo else "none"
            if action == "raise":
                raise Boom(lsn)
            if action == "stop":
                self.stop.set()
            elif action == "live":
                self.live = object()
            elif action == "unlive":
                self.live = None
            elif action != "none":
                self.state = {"idle": IDLE, "txn": TXN, "stream": STREAM}[action]

        return handle

    def drop_live(self, why: str) -> None:
        self.log.append(("drop_live", why))
        self.live = None

    def reads(self, fallback: Any) -> tuple[Any, Any, Any]:
        """dispatch_batch's open_state, fallback and stop flag, as the Worker passes them."""
        return open_state_of(self), fallback, self.stop  # type: ignore[arg-type]

    def dispatch(self, lsn: int, msg: Any) -> None:
        self.log.append(("dispatch", lsn))
        Applier.dispatch(self, lsn, msg)  # type: ignore[arg-type]


def _run(loop: str, batch: list[tuple[int, Any]], actions: dict[str, list[str]]) -> Any:
    h = Harness(actions, loop)
    try:
        if loop == "c":
            speedups.dispatch_batch(batch, h.handlers, *h.reads(h.dispatch))
        else:
            py_dispatch.dispatch_batch(batch, h.handlers, *h.reads(h.dispatch))
        outcome: Any = "ok"
    except (Boom, ProtocolError) as e:
        outcome = (type(e).__name__, str(e))
    # The fallback is logged only in C's path ("dispatch" entries): compare the rest.
    calls = [entry for entry in h.log if entry[0] != "dispatch"]
    return calls, outcome, h.state, h.live is None, bool(h.stop)


@settings(max_examples=300, deadline=None)
@given(
    kinds=st.lists(st.sampled_from([A, B, C, _begin]), max_size=30),
    a=st.lists(st.sampled_from(ACTIONS), max_size=30),
    b=st.lists(st.sampled_from(ACTIONS), max_size=30),
    begin=st.lists(st.sampled_from(ACTIONS), max_size=30),
)
# A Begin while a transaction is live: dispatch drops it first (not the fast path).
@example(kinds=[A, _begin, B], a=["live"], b=[], begin=["txn"])
# A stop asked for inside a handler: both loops end after that message.
@example(kinds=[A, A, A], a=["none", "stop"], b=[], begin=[])
# A handler that raises: the same error, nothing after it.
@example(kinds=[A, B, A], a=["txn", "raise"], b=["none"], begin=[])
def test_the_c_loop_makes_the_python_loops_calls(
    kinds: list[Any], a: list[str], b: list[str], begin: list[str]
) -> None:
    batch = [(i, kind()) for i, kind in enumerate(kinds)]
    actions = {"A": a, "B": b, "Begin": begin}
    assert _run("c", batch, actions) == _run("python", batch, actions)


def test_the_fast_path_skips_the_dispatch_method_and_the_rest_goes_through_it() -> None:
    h = Harness({"A": ["txn", "live", "none"], "B": []})
    batch = [(1, A()), (2, A()), (3, B()), (4, A())]
    speedups.dispatch_batch(batch, h.handlers, *h.reads(h.dispatch))
    # 1, 2: IDLE then TXN, no live: straight to the handler. 3: live set by 2,
    # through dispatch (which drops nothing for B: not one of _DROPS_LIVE). 4: the same.
    assert [e[:2] for e in h.log] == [
        ("A", 1), ("A", 2), ("dispatch", 3), ("B", 3), ("dispatch", 4), ("A", 4),
    ]  # fmt: skip


def test_a_message_in_the_wrong_state_is_the_dispatch_methods_error() -> None:
    h = Harness({"A": [], "B": []})
    with pytest.raises(ProtocolError, match="unexpected B message while idle"):
        speedups.dispatch_batch([(7, B())], h.handlers, *h.reads(h.dispatch))
    assert h.log == [("dispatch", 7)]


def test_bad_arguments_are_a_type_error() -> None:
    h = Harness({"A": [], "B": []})
    with pytest.raises(TypeError):
        speedups.dispatch_batch([A()], h.handlers, *h.reads(h.dispatch))
    with pytest.raises(TypeError):
        speedups.dispatch_batch((), h.handlers, *h.reads(h.dispatch))  # type: ignore[arg-type]


def _outcome(loop: str, batch: list[Any], entry: Any = None) -> Any:
    """_run's outcome with A's handlers entry replaced, and any error's type."""
    h = Harness({"A": ["txn"], "B": []}, loop)
    if entry is not None:
        h.handlers[A] = entry(h.handlers[A])
    try:
        if loop == "c":
            speedups.dispatch_batch(batch, h.handlers, *h.reads(h.dispatch))
        else:
            py_dispatch.dispatch_batch(batch, h.handlers, *h.reads(h.dispatch))
        outcome: Any = "ok"
    except Exception as e:  # any type: what is compared
        outcome = type(e).__name__
    return [e for e in h.log if e[0] != "dispatch"], outcome, h.state


@pytest.mark.parametrize(
    "entry",
    [
        lambda e: (list(e[0]), e[1]),  # states in a list: `in` works
        lambda e: (tuple(e[0]), e[1]),
        lambda e: (5, e[1]),  # not a container: TypeError
        lambda e: (e[0], e[1], None),  # not a pair: the dispatch method's way
        lambda e: [e[0], e[1]],
    ],
    ids=["list", "tuple", "int", "triple", "pair-list"],
)
def test_a_malformed_handlers_entry_is_taken_as_the_python_loop_takes_it(entry: Any) -> None:
    """A handlers entry whose states are not a set: the C loop raised SystemError
    (PySet_Contains), the Python loop's `in` works or raises TypeError."""
    batch = [(1, A()), (2, B()), (3, A())]
    c = _outcome("c", batch, entry)
    assert c == _outcome("python", batch, entry)
    assert c[1] != "SystemError"


@pytest.mark.parametrize(
    "item", [[1, "A"], (1, "A", None), (1,), "A"], ids=["list", "triple", "single", "str"]
)
def test_a_malformed_batch_item_is_taken_as_the_python_loop_takes_it(item: Any) -> None:
    """A batch item that is not an (lsn, msg) tuple: the Python loop unpacks a pair
    of any kind and raises ValueError for another length (the C loop: TypeError)."""
    if isinstance(item, list):
        item = [item[0], A()]
    elif isinstance(item, tuple) and len(item) == 3:
        item = (item[0], A(), item[2])
    batch = [(0, A()), item, (2, A())]
    assert _outcome("c", batch) == _outcome("python", batch)
