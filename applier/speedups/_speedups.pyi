# Types of the C module built from module.c and the files it lists (applier/speedups/__init__.py).
from collections.abc import Callable, Sequence

_Data = bytes | bytearray | memoryview

def tuple_data(data: _Data, pos: int, /) -> tuple[bytes, tuple[bytes | None, ...], int] | None: ...
def copy_text_row(values: Sequence[bytes | None], /) -> bytes: ...
def copy_binary_row(values: Sequence[bytes | None], /) -> bytes: ...
def tuple_text_line(data: _Data, pos: int, /) -> tuple[bytes | None, int]: ...
def tuple_text_lines(
    datas: list[_Data], start: int, pos: int, width: int, limit: int, /
) -> tuple[bytes, int]: ...
def take_xlog(
    get: object,
    table: list[Callable[[bytes], object]],
    decode: Callable[[bytes], object],
    out: list[object],
    room: int,
    lsn_type: object,
    state: list[object],
    group: object = ...,
    /,
) -> int: ...
def fill_copy(
    consume: Callable[[], object],
    get: Callable[[], tuple[int, object]],
    data: bytearray,
    lens: bytearray,
    room: int,
    /,
) -> int: ...
def dispatch_batch(
    batch: list[object],
    handlers: dict[type, object],
    open_state: Callable[[], object],
    fallback: Callable[[object, object], object],
    stop: Flag,
    /,
) -> None: ...

class Flag:
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def __bool__(self) -> bool: ...

def hold_rows(
    datas: list[bytes],
    lsns: list[int],
    start: int,
    width: int,
    key: tuple[int, ...],
    rows: object,
    keys: set[object] | None,
    txn: object,
    no: int,
    size: int,
    max_rows: int,
    max_bytes: int,
    /,
) -> tuple[int, int]: ...
def bind_rows(
    begin: type,
    commit: type,
    insert: type,
    update: type,
    delete: type,
    tupledata: type,
    lsn: type,
    twins: tuple[object, ...],
    /,
) -> None: ...
def decode_begin(data: bytes, /) -> object: ...
def decode_commit(data: bytes, /) -> object: ...
def decode_insert(data: bytes, /) -> object: ...
def decode_update(data: bytes, /) -> object: ...
def decode_delete(data: bytes, /) -> object: ...
