"""The C speedups (applier/speedups/*.c) give exactly what their Python twins give.

Property tests over generated TupleData (every column kind, empty values, no
columns, long values, many columns) and over generated damage to it
(truncation, bad kinds, lengths past the end, random bytes): the C reader
accepts exactly what the Python one accepts, with equal kinds, values and end,
and where both refuse, the decoder raises the same DecodeError. COPY rows:
equal bytes for values full of the bytes COPY text escapes, NULLs, and
bytes-likes. scripts/test runs the protocol, stream and an apply subset once
more with ``APPLIER_PURE_PYTHON=1``, so both implementations pass them.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from applier import __version__, speedups
from applier.apply.sql import copyrun
from applier.errors import DecodeError
from applier.protocol import TupleData, decoder, encode_tuple
from applier.protocol import tuples as reader
from applier.speedups import copyrun as py_copyrun
from applier.speedups import dispatch as py_dispatch
from applier.speedups import mergelane as py_mergelane
from applier.speedups import readahead as py_readahead
from applier.speedups import takeloop as py_takeloop
from applier.speedups import tuples as py_tuples

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

try:
    from applier.speedups import _speedups as native
except ImportError:  # the test below fails for it; the others skip
    native = None  # type: ignore[assignment]

needs_native = pytest.mark.skipif(native is None, reason="the C speedups are not built")
#: The C row decoders run once the decoder bound them: not with APPLIER_PURE_PYTHON.
needs_row_decoders = pytest.mark.skipif(
    speedups.IMPLEMENTATION != "C", reason="the C row decoders are not chosen"
)
#: The decoder's TupleData reader around the Python twin (what pure Python runs).
_tuple_py = py_tuples.tuple_reader(reader._new_tuple, reader._tuple_error)


def _tuple_c(data: Any, pos: int, tag: str) -> tuple[TupleData, int]:
    """The decoder's reader around tuples.c (what the chooser makes of it)."""
    got = native.tuple_data(data, pos)
    if got is None:
        reader._tuple_error(data, pos, tag)
    kinds, values, end = got
    return reader._new_tuple(kinds, values), end


def test_the_c_speedups_are_built_and_chosen() -> None:
    """scripts/setup builds them: a test run must not silently cover pure Python only."""
    assert native is not None, (
        "applier/speedups/*.c are not built (scripts/setup or python hatch_build.py)"
    )
    if not os.environ.get("APPLIER_PURE_PYTHON"):
        assert speedups.describe() == "C speedups"
        assert reader._tuple is not _tuple_py
        assert decoder._tuple is reader._tuple  # what the row messages call
        assert copyrun.text_row is native.copy_text_row
        assert copyrun.binary_row is native.copy_binary_row


def test_a_build_from_older_sources_is_named_not_a_crash() -> None:
    """A development tree updated without rebuilding has a module that lacks the
    newer functions: speedups.missing names them (the import then runs pure Python
    and --version says to rebuild), and the module built here lacks none."""
    stale = types.ModuleType("stale")
    for name in speedups.FUNCTIONS:
        if name != "dispatch_batch":
            setattr(stale, name, len)
    assert speedups.missing(stale) == ["dispatch_batch"]
    assert speedups.missing(types.ModuleType("empty")) == list(speedups.FUNCTIONS)
    if native is not None:
        assert speedups.missing(native) == []


# ------------------------------------------------------------------ TupleData

_KIND = st.sampled_from(b"tbnu")
_VALUE = st.one_of(
    st.binary(max_size=40),
    st.just(b""),
    # Long values, cheaply: lengths past one and two bytes' worth.
    st.builds(lambda n, b: b * n, st.integers(257, 70_000), st.sampled_from([b"x", b"\\\t"])),
)


@st.composite
def tuples(draw: st.DrawFn) -> TupleData:
    n = draw(st.one_of(st.integers(0, 12), st.sampled_from([127, 128, 129, 300])))
    if n > 12:  # wide rows: mostly text, so the shared all-text kinds are exercised
        kinds = bytes(draw(st.sampled_from([b"t" * n, b"t" * (n - 1) + b"n", b"b" * n])))
        values = tuple(None if k in b"nu" else draw(st.binary(max_size=4)) for k in kinds)
        return TupleData(kinds, values)
    kinds = bytes(draw(st.lists(_KIND, min_size=n, max_size=n)))
    values = tuple(None if k in b"nu" else draw(_VALUE) for k in kinds)
    return TupleData(kinds, values)


def _both(data: bytes, pos: int) -> None:
    """The C and Python readers agree on ``data`` at ``pos``: same tuple, or same error."""
    assert native is not None
    got_c = native.tuple_data(data, pos)
    try:
        want, end = _tuple_py(data, pos, "I")
    except DecodeError as exc:
        assert got_c is None, (data, pos)
        with pytest.raises(DecodeError) as from_c:
            _tuple_c(data, pos, "I")
        assert (str(from_c.value), from_c.value.offset) == (str(exc), exc.offset)
        return
    assert got_c is not None, (data, pos)
    kinds, values, end_c = got_c
    assert (kinds, values, end_c) == (want.kinds, want.values, end)
    assert type(kinds) is bytes and all(type(v) is bytes or v is None for v in values)


@needs_native
@SETTINGS
@given(tup=tuples(), prefix=st.binary(max_size=6), suffix=st.binary(max_size=6))
def test_valid_tuples_read_the_same(tup: TupleData, prefix: bytes, suffix: bytes) -> None:
    data = prefix + encode_tuple(tup) + suffix
    _both(data, len(prefix))
    assert native is not None
    got = native.tuple_data(data, len(prefix))
    assert got is not None and got[:2] == (tup.kinds, tup.values)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[bytes, int]:
    data = bytearray(encode_tuple(draw(tuples())))
    how = draw(st.sampled_from(["cut", "flip", "kind", "length", "count"]))
    if how == "cut" and data:
        del data[draw(st.integers(0, len(data) - 1)) :]
    elif how == "flip" and data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "kind":
        data += draw(st.sampled_from([b"x", b"\x00", b"T", b"t\x00", b"b\xff\xff\xff\xff"]))
        data[0:2] = struct.pack(">H", (data[0] << 8 | data[1]) + 1)
    elif how == "length":
        data += b"t" + struct.pack(">I", draw(st.sampled_from([1, 2**31, 2**32 - 1])))
        data[0:2] = struct.pack(">H", (data[0] << 8 | data[1]) + 1)
    else:
        data[0:2] = struct.pack(">H", draw(st.integers(0, 0xFFFF)))
    return bytes(data), 0


@needs_native
@SETTINGS
@given(case=damaged())
def test_damaged_tuples_are_refused_alike(case: tuple[bytes, int]) -> None:
    _both(*case)


@needs_native
@SETTINGS
@given(data=st.binary(max_size=30), pos=st.integers(0, 32))
def test_random_bytes_are_refused_alike(data: bytes, pos: int) -> None:
    _both(data, pos)


def _lines_alike(data: bytes, pos: int) -> None:
    """The C and Python copy-lane framers agree: same (line, width) or both refuse."""
    assert native is not None
    assert native.tuple_text_line(data, pos) == py_copyrun.tuple_text_line(data, pos), (data, pos)


@needs_native
@SETTINGS
@given(tup=tuples(), prefix=st.binary(max_size=6), suffix=st.binary(max_size=2))
def test_copy_lane_lines_frame_the_same(tup: TupleData, prefix: bytes, suffix: bytes) -> None:
    data = prefix + encode_tuple(tup) + suffix
    _lines_alike(data, len(prefix))
    if not suffix and not set(tup.kinds) - set(b"tn"):
        # Text and NULLs only, ending the message: exactly the row COPY gets.
        assert native is not None
        assert native.tuple_text_line(data, len(prefix)) == (
            py_copyrun.copy_text_row(tup.values),
            len(tup.kinds),
        )


@needs_native
@SETTINGS
@given(case=damaged())
def test_copy_lane_refuses_damaged_tuples_alike(case: tuple[bytes, int]) -> None:
    _lines_alike(*case)


@needs_native
def test_edge_tuples() -> None:
    for data, pos in [
        (b"", 0), (b"\x00", 0), (b"\x00\x00", 0), (b"\x00\x00", 2), (b"\x00\x00", 5),
        (b"\x00\x01t\x00\x00\x00\x00", 0), (b"\x00\x01t\x00\x00\x00", 0),
        (b"\x00\x01u", 0), (b"\x00\x02nu", 0), (b"\x00\x01b\xff\xff\xff\xff", 0),
    ]:  # fmt: skip
        _both(data, pos)
    assert native is not None
    with pytest.raises(OverflowError):
        native.tuple_data(b"\x00\x00", -(2**70))
    # All-text rows share one kinds object, as in the Python reader.
    a, b = (
        native.tuple_data(b"\x00\x01t\x00\x00\x00\x01a", 0),
        native.tuple_data(b"\x00\x01t\x00\x00\x00\x00", 0),
    )
    assert a is not None and b is not None and a[0] is b[0]


@needs_native
@SETTINGS
@given(tup=tuples(), old=st.none() | tuples(), in_stream=st.booleans(), cut=st.integers(0, 3))
def test_row_messages_decode_the_same(
    tup: TupleData, old: TupleData | None, in_stream: bool, cut: int
) -> None:
    """Through the decoder's Insert/Update/Delete paths: equal messages, or the same error."""
    xid = struct.pack(">I", 7) if in_stream else b""
    rel = struct.pack(">I", 42)
    msgs = [b"I" + xid + rel + b"N" + encode_tuple(tup)]
    msgs.append(msgs[0][:1] + b"D" + msgs[0][1:])  # a bad tag byte becomes the marker
    msgs.append(b"D" + xid + rel + b"K" + encode_tuple(tup))
    pre = b"" if old is None else b"O" + encode_tuple(old)
    msgs.append(b"U" + xid + rel + pre + b"N" + encode_tuple(tup))
    for data in msgs:
        data = data[: len(data) - cut]
        body = {73: decoder._insert, 85: decoder._update, 68: decoder._delete}[data[0]]
        outcomes = []
        for impl in (_tuple_py, reader._tuple):
            saved, decoder._tuple = decoder._tuple, impl
            try:
                outcomes.append(repr(body(data, 1 + len(xid), None)))
            except DecodeError as exc:
                outcomes.append(f"DecodeError({exc}, {exc.offset})")
            finally:
                decoder._tuple = saved
        assert outcomes[0] == outcomes[1]


# ------------------------------------------------------------------- COPY rows

_ESCAPY = st.binary(max_size=30) | st.lists(
    st.sampled_from(b"\\\t\n\rNa\x00\xff"), max_size=30
).map(bytes)
_ROW = st.lists(st.none() | _ESCAPY, max_size=12)


@needs_native
@SETTINGS
@given(row=_ROW)
def test_copy_rows_frame_the_same(row: list[bytes | None]) -> None:
    assert native is not None
    assert native.copy_text_row(row) == py_copyrun.copy_text_row(row)
    assert native.copy_binary_row(row) == py_copyrun.copy_binary_row(row)
    as_tuple = tuple(row)
    assert native.copy_text_row(as_tuple) == py_copyrun.copy_text_row(as_tuple)


@needs_native
@SETTINGS
@given(row=_ROW, wrap=st.sampled_from([bytearray, memoryview]))
def test_copy_rows_take_bytes_likes(row: list[bytes | None], wrap: type) -> None:
    assert native is not None
    wrapped = [None if v is None else wrap(v) for v in row]
    assert native.copy_text_row(wrapped) == py_copyrun.copy_text_row(row)
    assert native.copy_binary_row(wrapped) == py_copyrun.copy_binary_row(row)


@needs_native
def test_copy_row_edges() -> None:
    assert native is not None
    wide = [b"x"] * 100 + [None] * 50 + [b"\\\t"]  # past the C code's small-row buffer
    for row in ([], [None], [b""], [b"", b""], [b"\\N"], wide):
        assert native.copy_text_row(row) == py_copyrun.copy_text_row(row)
        assert native.copy_binary_row(row) == py_copyrun.copy_binary_row(row)
    for bad in ([1], ["text"], 5):
        with pytest.raises(TypeError):
            native.copy_text_row(bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            native.copy_binary_row(bad)  # type: ignore[arg-type]


@needs_native
def test_copy_binary_row_refuses_too_many_values_as_its_twin() -> None:
    """COPY binary counts a row's values in an int16: over 32767, the C framer raised
    OverflowError where its twin raises struct.error."""
    assert native is not None
    row: list[bytes | None] = [None] * 32_768
    with pytest.raises(struct.error):
        py_copyrun.copy_binary_row(row)
    with pytest.raises(struct.error):
        native.copy_binary_row(row)
    assert native.copy_binary_row(row[1:]) == py_copyrun.copy_binary_row(row[1:])


# ------------------------------------------------------- the merge lane's loop

#: Rows of a 3-column table keyed on (0,) or (0, 2): small key values so keys repeat.
_CELL = st.one_of(st.sampled_from([b"1", b"2", b"3", b"x\t"]), st.binary(max_size=5))
_ROW_KIND = st.sampled_from(b"ttttbnu")


@st.composite
def lane_runs(draw: st.DrawFn) -> list[bytes]:
    """Streamed row messages of one head: mostly plain rows, some with an unchanged
    TOAST value, another width, damage or trailing bytes (where the loop must stop)."""
    head = b"U" + struct.pack(">II", 7, 16384) + b"N"
    out = []
    for _ in range(draw(st.integers(0, 12))):
        width = draw(st.sampled_from([3, 3, 3, 3, 2]))
        kinds = bytes(draw(st.lists(_ROW_KIND, min_size=width, max_size=width)))
        values = tuple(None if k in b"nu" else draw(_CELL) for k in kinds)
        data = head + encode_tuple(TupleData(kinds, values))
        how = draw(st.sampled_from(["plain"] * 6 + ["cut", "tail"]))
        if how == "cut":
            data = data[: draw(st.integers(10, len(data) - 1))]
        elif how == "tail":
            data += b"\x00"
        out.append(data)
    return out


@needs_native
@SETTINGS
@given(
    datas=lane_runs(),
    key=st.sampled_from([(0,), (0, 2)]),
    delete=st.booleans(),
    max_rows=st.integers(1, 8),
    max_bytes=st.sampled_from([30, 60, 10**9]),
    held=st.lists(st.sampled_from([b"1", b"2", None]), max_size=2),
)
def test_hold_rows_holds_what_its_python_twin_holds(
    datas: list[bytes],
    key: tuple[int, ...],
    delete: bool,
    max_rows: int,
    max_bytes: int,
    held: list[bytes | None],
) -> None:
    """Same count, size, rows (values, kinds, lane reference) and keys, from the same
    start, whatever the rows: where one stops the other stops."""

    assert native is not None
    lsns = [0x1000 + i for i in range(len(datas))]
    txn = object()
    out = []
    for hold in (native.hold_rows, py_mergelane.hold_rows):
        # A holder that holds something already (an earlier key; for DELETEs, keys
        # the run may repeat).
        rows: Any = [] if delete else {k: ((k,), b"t", None) for k in held}
        keys = set(held) if delete else None
        got = hold(datas, lsns, 0, 3, key, rows, keys, txn, 5, 0, max_rows, max_bytes)
        out.append((got, rows, keys))
    assert out[0] == out[1]
    (count, size), rows, _ = out[0]
    assert 0 <= count <= len(datas)
    assert size == (0 if delete else sum(map(len, datas[:count])))


@needs_native
def test_hold_rows_leaves_keys_wider_than_index_max_keys_to_the_caller() -> None:
    """A key of 33 columns (PostgreSQL built with a larger INDEX_MAX_KEYS) is held
    row by row by the caller: both twins take nothing."""
    from applier.speedups.mergelane import MAX_KEY

    assert native is not None
    width = MAX_KEY + 1
    data = (
        b"U"
        + struct.pack(">II", 7, 16384)
        + b"N"
        + encode_tuple(TupleData(b"t" * width, (b"1",) * width))
    )
    key = tuple(range(width))
    for hold in (native.hold_rows, py_mergelane.hold_rows):
        rows: dict[Any, Any] = {}
        assert hold([data], [1], 0, width, key, rows, None, None, 1, 7, 256, 10**9) == (0, 7)
        assert rows == {}


# ------------------------------------------------------------------ the switch


def test_the_switch_is_not_a_config_key() -> None:
    """APPLIER_PURE_PYTHON starts like a key override but must not be read as one (exit 2)."""
    from applier.config import Config
    from applier.configenv import overrides

    assert overrides({"APPLIER_PURE_PYTHON": "1"}, Config) == []


def test_version_says_which_implementation_runs() -> None:
    def version(pure: bool) -> str:
        env = {k: v for k, v in os.environ.items() if k != "APPLIER_PURE_PYTHON"}
        if pure:
            env["APPLIER_PURE_PYTHON"] = "1"
        proc = subprocess.run(
            [sys.executable, "-m", "applier.cli", "--version"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert version(pure=False) == f"applier, version {__version__} (C speedups)\n"
    assert "(pure Python (APPLIER_PURE_PYTHON is set))" in version(pure=True)


# ------------------------------------------------- transaction and row messages


@st.composite
def plain_messages(draw: st.DrawFn) -> bytes:
    """Begin, Commit, Insert, Update, Delete outside a stream block, valid or damaged."""
    tag = draw(st.sampled_from(b"BCIUD"))
    if tag == ord("B"):
        data = b"B" + struct.pack(">QqI", draw(_U64), draw(_I64), draw(_U32))
    elif tag == ord("C"):
        flags = draw(st.sampled_from([0, 0, 0, 1, 255]))
        data = b"C" + struct.pack(">BQQq", flags, draw(_U64), draw(_U64), draw(_I64))
    else:
        rel = struct.pack(">I", draw(_U32))
        new = b"N" + encode_tuple(draw(tuples()))
        old = draw(st.sampled_from([b"", b"K", b"O"]))
        old += encode_tuple(draw(tuples())) if old else b""
        body = {73: new, 85: old + new, 68: old or b"K" + encode_tuple(draw(tuples()))}[tag]
        data = bytes([tag]) + rel + body
    how = draw(st.sampled_from(["valid", "valid", "cut", "flip", "marker", "extra"]))
    buf = bytearray(data)
    if how == "marker" and len(buf) > 5:  # the tuple marker of a row message
        buf[5] = draw(st.sampled_from(b"NKOX\x00"))
    elif how == "cut":
        del buf[draw(st.integers(1, len(buf) - 1)) :]
    elif how == "flip" and len(buf) > 1:
        buf[draw(st.integers(1, len(buf) - 1))] = draw(st.integers(0, 255))
    elif how == "extra":
        buf += draw(st.binary(min_size=1, max_size=3))
    return bytes(buf)


_U32 = st.integers(0, 2**32 - 1)
_U64 = st.integers(0, 2**64 - 1)
_I64 = st.integers(-(2**63), 2**63 - 1)


def _outcome(decode: Any, data: bytes) -> str:
    try:
        msg = decode(data)
    except DecodeError as exc:
        return f"DecodeError({exc}, {exc.offset})"
    lsns = [type(v).__name__ for v in vars_of(msg) if isinstance(v, int)]
    return f"{msg!r} {lsns}"


def vars_of(msg: Any) -> list[Any]:
    return [getattr(msg, name) for name in msg.__slots__]


@needs_row_decoders
@SETTINGS
@given(data=plain_messages())
def test_plain_messages_decode_as_their_python_twins(data: bytes) -> None:
    """The C decoders (decoder.c) give equal messages, with Lsn fields, or the same error."""
    twin = {66: decoder._begin, 67: decoder._commit, 73: decoder._insert}
    twin |= {85: decoder._update, 68: decoder._delete}
    saved, decoder._tuple = decoder._tuple, _tuple_py  # all Python
    try:
        expected = _outcome(twin[data[0]], data)
    finally:
        decoder._tuple = saved
    assert _outcome(decoder._ROW_DECODERS[chr(data[0])], data) == expected
    assert _outcome(decoder.PgOutputDecoder(2).decode, data) == expected


# ------------------------------------------------------------------ bytes-likes


@contextmanager
def pure_python() -> Iterator[None]:
    """The Python twins all the way down: the decoder's row functions (the twins of
    decoder.c) read TupleData with the chosen reader (C, when built), which a twin
    comparison must not use. (The twins in applier.speedups call only twins.)"""
    patches = [(decoder, "_tuple", _tuple_py)]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in patches]
    try:
        for mod, name, twin in patches:
            setattr(mod, name, twin)
        yield
    finally:
        for mod, name, value in saved:
            setattr(mod, name, value)


def _insert_bytes(values: tuple[bytes | None, ...]) -> bytes:
    return b"I" + struct.pack(">I", 42) + b"N" + encode_tuple(TupleData.text(*values))


_LIKES = [bytearray, memoryview]


@needs_native
@pytest.mark.parametrize("like", _LIKES)
def test_readers_take_the_bytes_likes_their_twins_take(like: type) -> None:
    """tuple_data, tuple_text_line(s) and the row decoders read a bytearray or a
    memoryview as their Python twins do (they raised TypeError: data must be bytes)."""
    assert native is not None
    data = _insert_bytes((b"1", None, b"a\tb\\"))
    with pure_python():
        want_tuple = py_tuples.tuple_data(like(data), 6)
        want_line = py_copyrun.tuple_text_line(like(data), 6)
        want_lines = py_copyrun.tuple_text_lines([like(data), data], 0, 6, 3, 10**6)
        want_insert = decoder._insert(like(data))
    assert native.tuple_data(like(data), 6) == want_tuple
    assert native.tuple_text_line(like(data), 6) == want_line
    assert native.tuple_text_lines([like(data), data], 0, 6, 3, 10**6) == want_lines
    assert decoder.decode_insert(like(data)) == want_insert  # C when chosen
    assert decoder._ROW_DECODERS["I"](like(data)) == want_insert


@pytest.mark.parametrize("like", _LIKES)
def test_text_rows_escape_bytes_likes(like: type) -> None:
    """The Python framer escaped no memoryview value (b"\\t" in a memoryview is
    False): a tab in a value split the COPY line."""
    row = [b"a\tb", None, b"\\\n"]
    want = b"a\\tb\t\\N\t\\\\\\n\n"
    wrapped = [None if v is None else like(v) for v in row]
    assert py_copyrun.copy_text_row(row) == want
    assert py_copyrun.copy_text_row(wrapped) == want
    if native is not None:
        assert native.copy_text_row(wrapped) == want


@pytest.mark.parametrize("like", _LIKES)
def test_hold_rows_takes_bytes_only_in_both_twins(like: type) -> None:
    """A run's rows are bytes (the stream's payloads): both twins refuse another
    type with TypeError (the Python twin held a memoryview's rows, and failed on a
    bytearray's only when a key value was hashed)."""

    data = b"U" + struct.pack(">II", 7, 16384) + b"N" + encode_tuple(TupleData.text(b"1"))
    twins = [py_mergelane.hold_rows] + ([] if native is None else [native.hold_rows])
    for hold in twins:
        with pure_python(), pytest.raises(TypeError):
            hold([like(data)], [1], 0, 1, (0,), {}, None, None, 1, 0, 256, 10**9)


# ------------------------------------- borrowed references across Python code


def _insert_frame(i: int, fill: int) -> bytes:
    """An XLogData of an Insert outside a stream block, at WAL 0x100 + i."""
    payload = (
        b"I" + struct.pack(">I", 16384) + b"N" + encode_tuple(TupleData.text(bytes([fill]) * 3))
    )
    return b"w" + struct.pack(">QQq", 0x100 + i, 0x100 + i, 0) + payload


@needs_native
def test_hold_rows_keeps_its_row_while_a_collection_drops_it() -> None:
    """A garbage collection during the read of a row (a gc.callbacks hook here) that
    drops the run's reference to the row's bytes: the row held is still those bytes'
    (it read freed memory: another object's values, and took a reference to it)."""
    import gc

    assert native is not None
    width = 24  # a tuple this wide is not from the free list: its allocation may collect
    head = b"U" + struct.pack(">II", 7, 16384) + b"N"

    def row(fill: int) -> bytes:
        return head + encode_tuple(TupleData(b"t" * width, (bytes([fill]) * 40,) * width))

    original = row(ord("a"))
    datas: list[Any] = [row(ord("a"))]  # an equal object, not the same
    junk: list[bytes] = []
    armed = [True]

    def hook(phase: str, info: dict[str, int]) -> None:
        if armed[0] and phase == "start":
            armed[0] = False
            datas[0] = None  # the row's only other reference
            junk.extend(row(ord("z")) for _ in range(50))  # what would reuse its memory

    rows: dict[Any, Any] = {}
    threshold = gc.get_threshold()
    gc.callbacks.append(hook)
    gc.set_threshold(1)
    try:
        got = native.hold_rows(datas, [1], 0, width, (0,), rows, None, None, 1, 0, 256, 10**9)
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(hook)
    assert not armed[0], "no collection ran during hold_rows"
    assert got == (1, len(original))
    [(values, kinds, (lsn, data, no, txn))] = rows.values()
    assert values == (bytes([ord("a")]) * 40,) * width and kinds == b"t" * width
    assert data == original and (lsn, no, txn) == (1, 1, None)


@needs_native
def test_an_insert_run_keeps_its_item_while_its_constructor_drops_it() -> None:
    """take_xlog turns a lone Insert's item into (its lsn, InsertRun(...)) with the
    item borrowed from ``out`` across the InsertRun's construction (Python code):
    when that drops the item, the run still gets the item's LSN (it read freed
    memory: another tuple's)."""
    from applier.lsn import Lsn
    from applier.protocol import Insert, InsertRun, StreamedChange, StreamedRun

    assert native is not None
    out: list[Any] = []
    junk: list[Any] = []

    class Dropping(InsertRun):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            out[-1] = None  # the item being replaced: its only reference
            junk.extend((Lsn(0xDEAD), None) for _ in range(50))

    frames = iter([_insert_frame(i, 97 + i) for i in range(3)])

    def get() -> tuple[int, bytes]:
        f = next(frames, None)
        return (0, b"") if f is None else (len(f), f)

    group = (StreamedChange, StreamedRun, Insert, Dropping)
    dec = decoder.PgOutputDecoder(2)
    state: list[Any] = [0, 0, 0, None, None, 0]
    assert native.take_xlog(get, dec.handlers, dec.decode, out, 100, Lsn, state, group) == 0
    [(lsn, run)] = out
    assert lsn == Lsn(0x100) and type(run) is Dropping
    assert run.lsns == [0x101, 0x102] and run.first.new.values == (b"aaa",)


@needs_native
def test_a_run_keeps_its_lists_while_get_drops_it() -> None:
    """The lists of the run being gathered were borrowed from the run (held by
    ``out``) across get(): when get drops the run, later rows went into freed lists
    (other lists, made after)."""
    from applier.lsn import Lsn
    from applier.protocol import Insert, InsertRun, StreamedChange, StreamedRun

    assert native is not None
    out: list[Any] = []
    junk: list[list[Any]] = []
    frames = [_insert_frame(i, 97 + i) for i in range(4)]
    calls = [0]

    def get() -> tuple[int, bytes]:
        calls[0] += 1
        if calls[0] == 3:  # the run the second Insert started is out[-1]
            out[-1] = None
            junk.extend([] for _ in range(50))
        f = frames[calls[0] - 1] if calls[0] <= len(frames) else None
        return (0, b"") if f is None else (len(f), f)

    group = (StreamedChange, StreamedRun, Insert, InsertRun)
    dec = decoder.PgOutputDecoder(2)
    state: list[Any] = [0, 0, 0, None, None, 0]
    assert native.take_xlog(get, dec.handlers, dec.decode, out, 100, Lsn, state, group) == 0
    assert out == [None] and not any(junk)
    assert state[:3] == [4, sum(map(len, frames)), 0x103]


# -------------------------------------------- twins on random and malformed input
#
# Each C function against its Python twin (pure_python(): no C below it), on
# valid, damaged and random bytes, as bytes, bytearray or memoryview, and on
# arguments of the wrong type: equal results (==: a twin's values are slices of
# its input, so a bytearray's are bytearrays), or the same exception type.
# Positions are offsets a caller computes: 0 up to past the end of the data.

_NOT_BYTES = st.sampled_from([None, "text", 5])
#: Not data to read (a str or a list of ints the Python readers index, by accident:
#: no caller passes one).
_NOT_DATA = st.sampled_from([None, 5])


def _result(fn: Any, *args: Any) -> tuple[str, Any]:
    try:
        return "ok", fn(*args)
    except Exception as exc:  # any type: what the twins are compared on
        return "error", type(exc).__name__


def _twins(c_fn: Any, py_fn: Any, *args: Any) -> tuple[str, Any]:
    got = _result(c_fn, *args)
    with pure_python():
        want = _result(py_fn, *args)
    assert got == want, args
    return got


@st.composite
def tuple_bytes(draw: st.DrawFn) -> bytes:
    """A TupleData: valid, damaged or random bytes, after a prefix."""
    how = draw(st.sampled_from(["valid", "damaged", "random"]))
    if how == "valid":
        body = encode_tuple(draw(tuples()))
    elif how == "damaged":
        body = draw(damaged())[0]
    else:
        body = draw(st.binary(max_size=24))
    return draw(st.binary(max_size=6)) + body + draw(st.binary(max_size=2))


_LIKE = st.sampled_from([bytes, bytearray, memoryview])


@st.composite
def data_args(draw: st.DrawFn) -> tuple[Any, int]:
    data = draw(tuple_bytes())
    pos = draw(st.integers(0, len(data) + 3))
    if draw(st.integers(0, 9)) == 0:
        return draw(_NOT_DATA), pos
    return draw(_LIKE)(data), pos


@needs_native
@SETTINGS
@given(args=data_args())
def test_tuple_readers_agree_on_anything(args: tuple[Any, int]) -> None:
    assert native is not None
    _twins(native.tuple_data, py_tuples.tuple_data, *args)
    _twins(native.tuple_text_line, py_copyrun.tuple_text_line, *args)


@needs_native
@SETTINGS
@given(
    datas=st.lists(data_args(), max_size=5),
    start=st.integers(0, 6),
    width=st.integers(0, 13),
    limit=st.sampled_from([0, 1, 40, 10**9]),
)
def test_tuple_text_lines_agree_on_anything(
    datas: list[tuple[Any, int]], start: int, width: int, limit: int
) -> None:
    assert native is not None
    pos = datas[0][1] if datas else 0
    rows = [d for d, _ in datas]
    _twins(native.tuple_text_lines, py_copyrun.tuple_text_lines, rows, start, pos, width, limit)


_CELLS = st.none() | _ESCAPY | _ESCAPY.map(bytearray) | _ESCAPY.map(memoryview)


@needs_native
@SETTINGS
@given(
    row=st.lists(_CELLS, max_size=12) | st.lists(_CELLS | _NOT_BYTES, max_size=4),
    shape=st.sampled_from([list, tuple, "other"]),
)
@example(row=[None, 5], shape=list)  # bytes(5) is five NUL bytes, not an error
def test_copy_rows_agree_on_anything(row: list[Any], shape: Any) -> None:
    assert native is not None
    values: Any = (5 if row else b"ab") if shape == "other" else shape(row)
    _twins(native.copy_text_row, py_copyrun.copy_text_row, values)
    _twins(native.copy_binary_row, py_copyrun.copy_binary_row, values)


@st.composite
def row_message(draw: st.DrawFn) -> Any:
    """Begin, Commit, Insert, Update, Delete: valid, damaged or random, any bytes-like."""
    if draw(st.booleans()):
        data = draw(plain_messages())
    else:
        data = bytes([draw(st.sampled_from(b"BCIUD"))]) + draw(st.binary(max_size=30))
    return draw(_LIKE)(data)


def _decoded(decode: Any, data: Any) -> tuple[str, Any]:
    try:
        return "ok", decode(data)
    except DecodeError as exc:  # the same words and offset, from either
        return "DecodeError", (str(exc), exc.offset)
    except Exception as exc:
        return "error", type(exc).__name__


@needs_row_decoders
@SETTINGS
@given(data=row_message())
def test_row_decoders_agree_on_anything(data: Any) -> None:
    tag = bytes(data[:1]).decode()
    twin = {"B": decoder._begin, "C": decoder._commit, "I": decoder._insert}
    twin |= {"U": decoder._update, "D": decoder._delete}
    got = _decoded(decoder._ROW_DECODERS[tag], data)
    with pure_python():
        assert got == _decoded(twin[tag], data)


@needs_native
@SETTINGS
@given(
    datas=lane_runs(),
    extra=st.lists(_NOT_BYTES | _LIKE.map(lambda like: like(b"U")), max_size=1),
    lsns_short=st.booleans(),
    start=st.integers(-1, 3),
    key=st.sampled_from([(0,), (0, 2), (3,), (-1,)]),
    delete=st.booleans(),
)
@example(datas=[], extra=[], lsns_short=False, start=0, key=(3,), delete=False)
@example(datas=[], extra=[b"U"], lsns_short=False, start=-1, key=(0,), delete=False)
def test_hold_rows_agrees_on_anything(
    datas: list[Any],
    extra: list[Any],
    lsns_short: bool,
    start: int,
    key: tuple[int, ...],
    delete: bool,
) -> None:
    """Rows the loop stops at, rows not bytes, fewer LSNs than rows, a start before
    the first row, a key column outside the width."""

    assert native is not None
    datas = datas + extra
    lsns = [0x1000 + i for i in range(len(datas) - (1 if lsns_short and datas else 0))]
    out = []
    for hold in (native.hold_rows, py_mergelane.hold_rows):
        rows: Any = [] if delete else {}
        keys = set() if delete else None
        with pure_python():
            got = _result(hold, datas, lsns, start, 3, key, rows, keys, None, 1, 0, 8, 10**9)
        out.append((got, rows, keys))
    assert out[0] == out[1]


@st.composite
def copydata_frames(draw: st.DrawFn) -> list[bytes]:
    """What libpq may hand the read loop: XLogData of valid, damaged or random row
    messages, keepalives, and CopyData that is neither or cut short."""
    frames = []
    for i in range(draw(st.integers(0, 8))):
        header = struct.pack(">QQq", 0x100 + i, 0x100 + i, 1000 + i)
        how = draw(st.sampled_from(["xlog", "xlog", "xlog", "keepalive", "cut", "empty", "junk"]))
        if how == "xlog":
            frames.append(b"w" + header + draw(plain_messages()))
        elif how == "keepalive":
            frames.append(b"k" + struct.pack(">Qqb", 0x100 + i, 1000 + i, 0))
        elif how == "cut":
            frames.append(b"w" + header[: draw(st.integers(0, len(header) - 1))])
        elif how == "empty":
            frames.append(b"w" + header)
        else:
            frames.append(draw(st.binary(min_size=1, max_size=12)))
    return frames


def _read_all(frames: list[bytes], c_loop: bool) -> Any:
    """What the stream reads of ``frames``, with the C loop or its twin; or the error."""
    from protocol_helpers import fake_stream

    from applier.stream import takeloop

    saved = takeloop.take_xlog
    takeloop.take_xlog = native.take_xlog if c_loop else py_takeloop.take_xlog
    try:
        stream, _ = fake_stream(2, frames)
        with nullcontext() if c_loop else pure_python():
            try:
                got: Any = stream.read(0)
            except Exception as exc:  # any type: what the twins are compared on
                got = (type(exc).__name__, str(exc), getattr(exc, "context", None))
        return got, stream.last_received, stream.messages_received, stream.last_send_time
    finally:
        takeloop.take_xlog = saved


@needs_native
@SETTINGS
@given(frames=copydata_frames())
def test_the_read_loops_agree_on_anything(frames: list[bytes]) -> None:
    """take_xlog (C) and its Python twin: the same items, positions and counts, or
    the same error with the same context."""
    assert _read_all(frames, c_loop=True) == _read_all(frames, c_loop=False)


class _ScriptedPg:
    """get_copy_data(1) from a script: n > 0 a message of n bytes, 0 nothing
    buffered, -1 the COPY's end, None an OperationalError (a lost connection)."""

    def __init__(self, script: list[int | None]) -> None:
        self.script = list(script)
        self.calls: list[str] = []

    def consume_input(self) -> None:
        self.calls.append("consume")

    def get_copy_data(self, async_: int) -> tuple[int, bytes]:
        self.calls.append("get")
        n = self.script.pop(0) if self.script else 0
        if n is None:
            import psycopg

            raise psycopg.OperationalError("lost")
        return n, bytes([n % 256]) * max(n, 0)


def _fill(script: list[int | None], room: int, c_loop: bool) -> Any:
    from array import array
    from functools import partial

    pg = _ScriptedPg(script)
    buf = bytearray()
    lens = array("q")
    fill = native.fill_copy if c_loop else py_readahead.fill_copy
    packed = bytearray()
    try:
        try:
            got: Any = fill(pg.consume_input, partial(pg.get_copy_data, 1), buf, packed, room) == 1
        finally:
            lens.frombytes(packed)
    except Exception as exc:  # any type: what the twins are compared on
        got = type(exc).__name__
    return got, bytes(buf), list(lens), pg.calls


@needs_native
@SETTINGS
@given(
    script=st.lists(st.none() | st.sampled_from([-1, 0, 0]) | st.integers(1, 40), max_size=12),
    room=st.integers(0, 120),
)
def test_the_fill_loops_agree_on_anything(script: list[int | None], room: int) -> None:
    """fill_copy (C) and its Python twin: the same bytes and lengths taken, the
    same calls to libpq, the same end or error."""
    assert _fill(script, room, c_loop=True) == _fill(script, room, c_loop=False)


# ------------------------------------------------- the read loop, with runs and cursors


@st.composite
def stream_payloads(draw: st.DrawFn) -> list[bytes]:
    """pgoutput messages as a stream carries them: plain ones, and stream blocks
    whose row changes (deferred) come in runs of one head, some damaged."""
    out: list[bytes] = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            out.append(draw(plain_messages()))
            continue
        xid = draw(st.sampled_from([7, 8]))
        out.append(b"S" + struct.pack(">IB", xid, 1))
        for _ in range(draw(st.integers(0, 5))):
            tag = draw(st.sampled_from(b"IUD"))
            rel = draw(st.sampled_from([1, 2]))
            kind = b"N" if tag != ord("D") else b"K"
            data = bytes([tag]) + struct.pack(">II", xid, rel) + kind
            out.append(data + encode_tuple(draw(tuples())))
        if draw(st.booleans()):
            out.append(b"E")
    if draw(st.booleans()):  # a run of Inserts outside stream blocks
        out += [_insert_bytes((str(i).encode(),)) for i in range(draw(st.integers(2, 4)))]
    if draw(st.integers(0, 9)) == 0:
        out.append(b"")  # an XLogData without a pgoutput message
    return out


def _frames_of(payloads: list[bytes], extra: list[bytes]) -> list[bytes]:
    frames = [
        b"w" + struct.pack(">QQq", 0x100 + i, 0x100 + i, 1000 + i) + p
        for i, p in enumerate(payloads)
    ]
    return frames + extra


def _take(take: Any, frames: list[bytes], cursor: bool, room: int) -> Any:
    """Everything ``take`` (take_xlog, C or twin) gives for ``frames``, with runs."""
    from array import array

    from applier.lsn import Lsn
    from applier.protocol import Insert, InsertRun, StreamedChange, StreamedRun

    dec = decoder.PgOutputDecoder(2, defer_streamed=True)
    group = (StreamedChange, StreamedRun, Insert, InsertRun)
    out: list[Any] = []
    state: list[Any] = [0, 0, 0, None, None, 0]
    got: Any
    if cursor:
        get: Any = [bytearray(b"".join(frames)), array("q", map(len, frames)), 0, 0]
    else:
        it = iter(frames)

        def get() -> tuple[int, bytes]:
            f = next(it, None)
            return (0, b"") if f is None else (len(f), f)

    try:
        got = take(get, dec.handlers, dec.decode, out, room, Lsn, state, group)
    except Exception as exc:  # any type: what the twins are compared on
        got = (type(exc).__name__, str(exc))
    where = get[2:] if cursor else None
    items = [(lsn, repr(m) if not hasattr(m, "datas") else (m.datas, m.lsns)) for lsn, m in out]
    return got, items, [bytes(s) if isinstance(s, memoryview) else s for s in state], where


@needs_native
@SETTINGS
@given(
    payloads=stream_payloads(),
    extra=st.lists(st.sampled_from([b"k" + bytes(17), b"w12", b"x"]), max_size=1),
    cursor=st.booleans(),
    room=st.sampled_from([1, 3, 100]),
)
def test_the_read_loops_agree_on_runs_and_cursors(
    payloads: list[bytes], extra: list[bytes], cursor: bool, room: int
) -> None:
    """take_xlog (C) and its twin with runs (StreamedRun, InsertRun), from get() or a
    read-ahead cursor read in place: the same items, state, cursor and status, or the
    same error."""
    frames = _frames_of(payloads, extra)
    got = _take(native.take_xlog, frames, cursor, room)
    with pure_python():
        want = _take(py_takeloop.take_xlog, frames, cursor, room)
    assert got == want


@needs_native
def test_the_read_loops_refuse_bad_arguments_alike() -> None:
    from applier.lsn import Lsn

    dec = decoder.PgOutputDecoder(2)
    for args in [
        ((lambda: (0, b"")), (), dec.decode, [], 1, Lsn, [0, 0, 0, None, None, 0]),
        ((lambda: (0, b"")), dec.handlers, dec.decode, [], 1, Lsn, [0, 0, 0]),
        ((lambda: 5), dec.handlers, dec.decode, [], 1, Lsn, [0, 0, 0, None, None, 0]),
        ([b"", b"", 0, 0], dec.handlers, dec.decode, [], 1, Lsn, [0, 0, 0, None, None, 0]),
    ]:
        _twins(native.take_xlog, py_takeloop.take_xlog, *args)
    _twins(native.fill_copy, py_readahead.fill_copy, int, int, b"", bytearray(), 5)
    _twins(native.dispatch_batch, py_dispatch.dispatch_batch, (), {}, int, int, int)
    # A stop request that is not the loop's own Flag (C reads it without a call).
    assert _result(native.dispatch_batch, [], {}, int, int, py_dispatch.Flag()) == (
        "error",
        "TypeError",
    )
    assert _result(py_dispatch.dispatch_batch, [], {}, int, int, native.Flag()) == (
        "error",
        "TypeError",
    )
    for flag in (native.Flag(), py_dispatch.Flag()):
        assert not flag
        flag.set()
        assert flag
        flag.clear()
        assert not flag


# ------------------------------------------------------------------ the chooser


def test_the_chooser_honours_the_switch_in_a_fresh_process() -> None:
    """Every function comes from the C module, or with APPLIER_PURE_PYTHON=1 from the
    Python twins beside it; the decoder and the lanes use what was chosen."""
    probe = (
        "import json\n"
        "from applier import speedups as s\n"
        "from applier.protocol import decoder, tuples\n"
        "from applier.apply.batching import mergelane\n"
        "from applier.apply.sql import copyrun\n"
        "from applier.stream import readahead, takeloop\n"
        "from applier.apply import batchdispatch\n"
        "names = [n for n in s.__all__ if callable(getattr(s, n)) and n not in\n"
        "         ('describe', 'missing', 'ReadTuple')]\n"
        "used = [tuples.read_tuple, copyrun.text_row, copyrun.binary_row,\n"
        "        mergelane.hold_rows, readahead.fill_copy, takeloop.take_xlog,\n"
        "        batchdispatch.dispatch_batch, decoder._ROW_DECODERS['I']]\n"
        "print(json.dumps([s.IMPLEMENTATION, s.describe(),\n"
        "    {n: getattr(s, n).__module__ for n in names},\n"
        "    sorted({getattr(f, '__module__', None) or 'C' for f in used})]))\n"
    )

    def choice(pure: bool) -> Any:
        import json

        env = {k: v for k, v in os.environ.items() if k != "APPLIER_PURE_PYTHON"}
        if pure:
            env["APPLIER_PURE_PYTHON"] = "1"
        proc = subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    impl, why, modules, used = choice(pure=True)
    assert (impl, why) == ("python", "pure Python (APPLIER_PURE_PYTHON is set)")
    assert all(m.startswith("applier.speedups.") for m in modules.values()), modules
    assert "applier.speedups._speedups" not in modules.values()
    assert all(m.startswith("applier.") for m in used), used
    if native is not None:
        impl, why, modules, used = choice(pure=False)
        assert (impl, why) == ("C", "C speedups")
        c_made = {n for n, m in modules.items() if m == "applier.speedups._speedups"}
        # row_decoders and tuple_reader are Python functions around the C ones.
        assert c_made == set(modules) - {"row_decoders", "tuple_reader"}, modules
        assert set(used) <= {"C", "applier.speedups._speedups"}, used
