"""Large objects with several owners and ACLs on a pair, and how to compare them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from conftest import Pair

#: Every object as each server sees it: metadata and an md5 of the data computed there.
STATE = (
    "SELECT oid::int8, pg_get_userbyid(lomowner)::text, lomacl::text, md5(lo_get(oid)) "
    "FROM pg_largeobject_metadata ORDER BY 1"
)


def state(pair: Pair, side: str) -> list[tuple[Any, ...]]:
    return pair.pub_exec(STATE) if side == "pub" else pair.sub_exec(STATE)


@contextmanager
def roles(pair: Pair, n: int = 3, *, target: bool = True) -> Iterator[list[str]]:
    """``n`` roles on the source (and the target), dropped with what they own afterwards."""
    tag = uuid.uuid4().hex[:6]
    names = [f"lo_{tag}_{i}" for i in range(n)]
    sides = [(pair.pub, pair.pub_db), *([(pair.sub, pair.sub_db)] if target else [])]
    for cluster, _ in sides:
        for r in names:
            cluster.execute(f"CREATE ROLE {r}")
    try:
        yield names
    finally:
        for cluster, db in sides:
            cluster.execute("".join(f"DROP OWNED BY {r};" for r in names), db)
            cluster.execute("".join(f"DROP ROLE {r};" for r in names))


def load(pair: Pair, r: list[str]) -> None:
    """Objects small and over a chunk (2.5 MB), empty, with owners, PUBLIC, a grantor
    who is not the owner, a grant option and the owner's own privilege revoked."""
    pair.pub_exec(
        "SELECT lo_from_bytea(10001, convert_to(repeat('a', 100), 'UTF8'));"
        "SELECT lo_from_bytea(10002, decode(repeat('ff00', 300000), 'hex'));"
        "SELECT lo_from_bytea(10003, ''::bytea);"
        "SELECT lo_from_bytea(10004, convert_to(string_agg(md5(g::text), '' ORDER BY g), 'UTF8'))"
        "  FROM generate_series(1, 80000) g;"
        f"ALTER LARGE OBJECT 10002 OWNER TO {r[0]};"
        f"ALTER LARGE OBJECT 10004 OWNER TO {r[1]};"
        f"GRANT SELECT ON LARGE OBJECT 10002 TO {r[1]};"
        f"GRANT SELECT, UPDATE ON LARGE OBJECT 10002 TO {r[2]} WITH GRANT OPTION;"
        f"SET ROLE {r[2]}; GRANT SELECT ON LARGE OBJECT 10002 TO {r[1]}; RESET ROLE;"
        "GRANT SELECT ON LARGE OBJECT 10004 TO PUBLIC;"
        f"REVOKE UPDATE ON LARGE OBJECT 10004 FROM {r[1]};"
    )
