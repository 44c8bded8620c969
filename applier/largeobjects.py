"""Large objects: what the logical stream cannot carry, copied by other means.

What is copied
==============

A large object is a row of ``pg_largeobject_metadata`` (its OID, its owner,
its ACL) and its data (pages of ``pg_largeobject``). pgoutput replicates
neither (nor does PostgreSQL's own subscriber): ``bootstrap`` copies them
under the slot's exported snapshot (:mod:`applier.bootstrap.largeobjects`),
``cutover`` makes the target's set the source's again once writes have
stopped (:func:`sync`), and ``verify`` compares them
(:mod:`applier.verify.largeobjects`). The OID is kept: applications keep
large objects' OIDs in their own columns (``oid`` / ``lo``), which the
stream carries as plain numbers.

Reading and writing
===================

Reads use ``lo_get(oid, offset, len)``, in :data:`CHUNK` pieces: only
``SELECT`` on the object is needed (``pg_largeobject`` itself is readable by
superusers only), and a 1 GB object never sits whole in memory, neither
here nor in the server. ``lo_get`` reads with the transaction's snapshot (a
read-only open, ``inv_open``), so a source transaction that imported the
bootstrap's snapshot sees each object as of the slot's consistent point.
Writes: ``lo_from_bytea(oid, data)`` for an object that fits in one piece
(one statement), else ``lo_create(oid)`` and one ``lo_put`` per piece;
then ``ALTER LARGE OBJECT ... OWNER TO``, then the ACL. A batch of objects
and their metadata commit in one target transaction, so a crash leaves
whole objects or none.

Owner and ACL
=============

The owner is set first, the ACL then replayed as the source has it: a
source ACL of NULL (the default: the owner may read and write) stays NULL;
any other is emptied (``REVOKE ALL ... FROM owner``) and its items granted
in their order (``GRANT ... [WITH GRANT OPTION]``, as the item's grantor
with ``SET ROLE`` when that is not the owner), so ``lomacl::text`` is the
source's. This needs the privileges of every owner and grantor role on the
target (superuser, or membership): :mod:`applier.privileges`. A role the
target lacks is a refusal naming it (create the role, then rerun): never a
copy owned by someone else, which would be a silent change of who may read
the data.

Comparing
=========

An object's digest is its size and a hash of its data computed in the
server: the md5 of the md5s of its :data:`CHUNK` pieces, computed chunk by
chunk in a recursive query, so the server never holds more than one piece
either. Both servers use the same chunking, so equal data gives equal
digests. ``verify`` and ``cutover`` compare (owner, ACL text, size, hash).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from . import pgconn
from .errors import ApplierError, PermanentError

log = logging.getLogger(__name__)
Conn = psycopg.Connection[Any]

#: Bytes read or written per call. 1 MB: a 1 GB object is 1024 round trips
#: each way; memory holds at most BATCH of them (first pieces of a batch).
CHUNK = 1 << 20
#: Objects whose first pieces are read in one query, and written in one
#: pipeline and one target transaction.
BATCH = 16


@dataclass(frozen=True, slots=True)
class Grant:
    """One ACL item (the privileges one grantor gave one grantee, ``None``: PUBLIC)."""

    grantee: str | None
    grantor: str
    privileges: tuple[str, ...]
    grantable: tuple[str, ...]  # of ``privileges``, those WITH GRANT OPTION


@dataclass(frozen=True, slots=True)
class LargeObject:
    """A large object's metadata: ``acl_text`` as the catalog shows it (None: the
    default privileges), ``acl`` its items in order."""

    oid: int
    owner: str
    acl_text: str | None
    acl: tuple[Grant, ...]

    @property
    def roles(self) -> set[str]:
        """The roles the target must have: the owner, every grantee and grantor."""
        out = {self.owner}
        for g in self.acl:
            out.add(g.grantor)
            if g.grantee is not None:
                out.add(g.grantee)
        return out


@dataclass(frozen=True, slots=True)
class Digest:
    """What is compared: metadata, size and the hash of the data."""

    owner: str
    acl_text: str | None
    size: int
    md5: str


_META = """
SELECT m.oid::pg_catalog.int8, pg_catalog.pg_get_userbyid(m.lomowner)::text, m.lomacl::text,
  (SELECT pg_catalog.json_agg(pg_catalog.json_build_array(
            i.n, CASE WHEN a.grantee = 0 THEN NULL
                      ELSE pg_catalog.pg_get_userbyid(a.grantee)::text END,
            pg_catalog.pg_get_userbyid(a.grantor)::text, a.privilege_type, a.is_grantable)
          ORDER BY i.n, a.privilege_type)
   FROM pg_catalog.unnest(m.lomacl) WITH ORDINALITY AS i(item, n),
        pg_catalog.aclexplode(ARRAY[i.item]) AS a)
FROM pg_catalog.pg_largeobject_metadata m
WHERE %(all)s OR m.oid = ANY(%(oids)s::pg_catalog.oid[])
ORDER BY 1
"""

#: Size and hash of each object, piece by piece (see "Comparing"): the
#: recursion keeps (offset, length, md5) of each piece, never the piece.
_DIGESTS = """
SELECT m.oid::pg_catalog.int8, pg_catalog.pg_get_userbyid(m.lomowner)::text, m.lomacl::text,
       d.size, d.md5
FROM pg_catalog.pg_largeobject_metadata m CROSS JOIN LATERAL (
  WITH RECURSIVE piece(off, len, h) AS (
    SELECT 0::pg_catalog.int8, pg_catalog.length(p), pg_catalog.md5(p)
    FROM (SELECT pg_catalog.lo_get(m.oid, 0, %(chunk)s) AS p) f
    UNION ALL
    SELECT c.off + %(chunk)s, pg_catalog.length(x.p), pg_catalog.md5(x.p)
    FROM piece c CROSS JOIN LATERAL
         (SELECT pg_catalog.lo_get(m.oid, c.off + %(chunk)s, %(chunk)s) AS p) x
    WHERE c.len = %(chunk)s
  )
  SELECT pg_catalog.sum(len)::pg_catalog.int8 AS size,
         pg_catalog.md5(pg_catalog.string_agg(h, '' ORDER BY off)) AS md5
  FROM piece
) d
WHERE %(all)s OR m.oid = ANY(%(oids)s::pg_catalog.oid[])
"""


def _which(oids: Iterable[int] | None) -> dict[str, Any]:
    return {"all": oids is None, "oids": [] if oids is None else list(oids)}


def count(conn: Conn) -> int:
    """How many large objects the database has (the catalog is readable by every role)."""
    row = conn.execute(count_sql())
    return int(row.fetchone()[0])  # type: ignore[index]


def metadata(conn: Conn, oids: Iterable[int] | None = None) -> list[LargeObject]:
    """The objects (all, or those of ``oids`` that exist), by OID, with their ACL items."""
    rows = conn.execute(_META, _which(oids)).fetchall()
    return [LargeObject(int(r[0]), r[1], r[2], _grants(r[3] or [])) for r in rows]


def _grants(items: list[list[Any]]) -> tuple[Grant, ...]:
    """ACL items from aclexplode's rows (one row per privilege), in the ACL's order."""
    out: list[Grant] = []
    by_item: dict[int, list[list[Any]]] = {}
    for it in items:
        by_item.setdefault(int(it[0]), []).append(it)
    for _, rows in sorted(by_item.items()):
        privs = tuple(r[3] for r in rows)
        grantable = tuple(r[3] for r in rows if r[4])
        out.append(Grant(rows[0][1], rows[0][2], privs, grantable))
    return tuple(out)


#: Objects hashed per statement: a statement stays short (verify's
#: statement_timeout bounds each) however many objects there are.
DIGEST_BATCH = 1024


def digests(conn: Conn, oids: Iterable[int] | None = None) -> dict[int, Digest]:
    """Each object's (owner, ACL text, size, hash), computed in the server, in
    statements of :data:`DIGEST_BATCH` objects (all of them, or ``oids``)."""
    if oids is None:
        rows = conn.execute(
            "SELECT oid::pg_catalog.int8 FROM pg_catalog.pg_largeobject_metadata ORDER BY 1"
        ).fetchall()
        oids = [int(r[0]) for r in rows]
    wanted = list(oids)
    out: dict[int, Digest] = {}
    for i in range(0, len(wanted), DIGEST_BATCH):
        params = {**_which(wanted[i : i + DIGEST_BATCH]), "chunk": CHUNK}
        for r in conn.execute(_DIGESTS, params).fetchall():
            out[int(r[0])] = Digest(r[1], r[2], int(r[3] or 0), str(r[4]))
    return out


def both_digests(
    src_digests: Callable[[], dict[int, Digest]], tgt_digests: Callable[[], dict[int, Digest]]
) -> tuple[dict[int, Digest], dict[int, Digest]]:
    """The two sides' digests computed at once (each server hashes its own data)."""
    out: dict[str, dict[int, Digest]] = {}
    failed: list[BaseException] = []

    def target() -> None:
        try:
            out["t"] = tgt_digests()
        except BaseException as e:  # re-raised in the calling thread
            failed.append(e)

    thread = threading.Thread(target=target, name="lo-digests", daemon=True)
    thread.start()
    try:
        out["s"] = src_digests()
    finally:
        thread.join()
    if failed:
        raise failed[0]
    return out["s"], out["t"]


def missing_roles(tgt: Conn, objects: Iterable[LargeObject]) -> list[str]:
    """The owner, grantee and grantor roles of ``objects`` that the target lacks."""
    wanted = sorted(set().union(*(lo.roles for lo in objects)))
    if not wanted:
        return []
    rows = tgt.execute(
        "SELECT r FROM pg_catalog.unnest(%s::text[]) r "
        "WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = r) ORDER BY 1",
        (wanted,),
    ).fetchall()
    return [str(r[0]) for r in rows]


# -- writing ------------------------------------------------------------------------


@dataclass
class Copied:
    objects: int = 0
    bytes: int = 0


def copy_objects(src: Conn, tgt: Conn, objects: Sequence[LargeObject], *, replace: bool) -> Copied:
    """Copy ``objects`` from ``src`` (in its transaction: its snapshot) to ``tgt``.

    One target transaction per :data:`BATCH` objects. ``replace``: an object
    of that OID on the target is unlinked first, in the same transaction
    (cutover's changed objects); else it must not exist.
    """
    done = Copied()
    me = current_user(tgt)
    for i in range(0, len(objects), BATCH):
        batch = objects[i : i + BATCH]
        try:
            with tgt.transaction():
                if replace:
                    _unlink(tgt, [lo.oid for lo in batch])
                done.bytes += _copy_batch(src, tgt, batch, me)
        except psycopg.Error as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise CopyFailed(
                f"copying large objects {batch[0].oid}..{batch[-1].oid} failed: {first}"
            ) from None
        done.objects += len(batch)
    return done


def _copy_batch(src: Conn, tgt: Conn, batch: Sequence[LargeObject], me: str) -> int:
    """Data, owner and ACL of a batch, in the caller's target transaction; the bytes."""
    firsts = dict(
        src.cursor(binary=True)
        .execute(
            "SELECT o::pg_catalog.int8, pg_catalog.lo_get(o, 0, %s) "
            "FROM pg_catalog.unnest(%s::pg_catalog.oid[]) o",
            (CHUNK, [lo.oid for lo in batch]),
        )
        .fetchall()
    )
    total = 0
    with tgt.pipeline():
        for lo in batch:
            first = bytes(firsts[lo.oid])
            tgt.execute("SELECT pg_catalog.lo_from_bytea(%s, %s)", (lo.oid, first), prepare=False)
            total += len(first)
    for lo in batch:
        if len(firsts[lo.oid]) == CHUNK:
            total += _copy_rest(src, tgt, lo.oid)
    with tgt.pipeline():
        for lo in batch:
            for stmt in metadata_statements(lo, me):
                tgt.execute(stmt)
    return total


def _copy_rest(src: Conn, tgt: Conn, oid: int) -> int:
    """The pieces after the first, one at a time (a big object never whole in memory)."""
    offset, total = CHUNK, 0
    while True:
        row = (
            src.cursor(binary=True)
            .execute("SELECT pg_catalog.lo_get(%s, %s, %s)", (oid, offset, CHUNK))
            .fetchone()
        )
        assert row is not None
        piece = bytes(row[0])
        if piece:
            tgt.execute("SELECT pg_catalog.lo_put(%s, %s, %s)", (oid, offset, piece))
        total += len(piece)
        offset += len(piece)
        if len(piece) < CHUNK:
            return total


def current_user(tgt: Conn) -> str:
    row = tgt.execute("SELECT current_user::text").fetchone()
    assert row is not None
    return str(row[0])


def metadata_statements(lo: LargeObject, me: str) -> Iterator[sql.Composed]:
    """Owner, then the ACL as the source has it (see "Owner and ACL")."""
    obj = sql.SQL("LARGE OBJECT {}").format(sql.Literal(lo.oid))
    if lo.owner != me:
        yield sql.SQL("ALTER {} OWNER TO {}").format(obj, sql.Identifier(lo.owner))
    if lo.acl_text is None:
        return
    # Empties the default ACL (owner=rw/owner); the items follow in the source's order.
    yield sql.SQL("REVOKE ALL ON {} FROM {}").format(obj, sql.Identifier(lo.owner))
    for g in lo.acl:
        as_grantor = g.grantor != lo.owner
        if as_grantor:
            yield sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(g.grantor))
        who = sql.SQL("PUBLIC") if g.grantee is None else sql.Identifier(g.grantee)
        plain = [p for p in g.privileges if p not in g.grantable]
        for privs, option in ((plain, ""), (list(g.grantable), " WITH GRANT OPTION")):
            if privs:
                yield sql.SQL("GRANT {} ON {} TO {}{}").format(
                    sql.SQL(", ").join(sql.SQL(p) for p in privs), obj, who, sql.SQL(option)
                )
        if as_grantor:
            yield sql.Composed([sql.SQL("RESET ROLE")])


def _unlink(tgt: Conn, oids: Iterable[int]) -> int:
    wanted = list(oids)
    if not wanted:
        return 0
    rows = tgt.execute(
        "SELECT pg_catalog.lo_unlink(m.oid) FROM pg_catalog.pg_largeobject_metadata m "
        "WHERE m.oid = ANY(%s::pg_catalog.oid[])",
        (wanted,),
    ).fetchall()
    return len(rows)


def unlink(tgt: Conn, oids: Sequence[int]) -> int:
    """Unlink ``oids`` on the target (those that exist), a batch per transaction."""
    n = 0
    for i in range(0, len(oids), BATCH * 64):
        with tgt.transaction():
            n += _unlink(tgt, oids[i : i + BATCH * 64])
    return n


# -- cutover --------------------------------------------------------------------------


@dataclass
class SyncCounts:
    """What :func:`sync` did: objects created, changed (data, owner or ACL), deleted."""

    created: int = 0
    changed: int = 0
    deleted: int = 0
    bytes: int = 0

    def describe(self) -> str:
        return (
            f"{self.created} created, {self.changed} changed, {self.deleted} deleted "
            f"({self.bytes} bytes copied)"
        )


class CopyFailed(ApplierError):
    """A server refused a batch (rolled back whole; the batches before it stay)."""


class LargeObjectError(PermanentError):
    """The large objects cannot be copied as they are (a role missing, a clash): exit 3."""


def refuse_missing_roles(tgt: Conn, objects: Iterable[LargeObject], what: str) -> None:
    lacking = missing_roles(tgt, objects)
    if lacking:
        names = ", ".join(sql.Identifier(r).as_string(None) for r in lacking)
        raise LargeObjectError(
            f"{what}: the target lacks role(s) {names}, owner or grantee of large objects",
            hint=f"create them on the target (CREATE ROLE {lacking[0]} ...; pg_dumpall "
            "--roles-only has them all) and rerun: large objects are copied with their owner "
            "and ACL, never owned by another role",
        )


def sync(src: Conn, tgt: Conn, tgt_hashing: Conn) -> SyncCounts:
    """Make the target's large objects the source's (cutover, writes stopped).

    ``src`` is in a transaction (one snapshot for digests and copies);
    ``tgt_hashing`` is a second target session, so both servers hash at
    once. An object whose data, owner or ACL differs is copied again whole
    (unlinked and created in one transaction): an ACL cannot be set back to
    NULL with GRANT/REVOKE, and a change of metadata alone is rare. Objects
    the source no longer has are unlinked on the target: after a migration
    the target's large objects are the source's, as its tables' rows are.
    """
    s, t = both_digests(lambda: digests(src), lambda: digests(tgt_hashing))
    created = sorted(o for o in s if o not in t)
    changed = sorted(o for o in s if o in t and s[o] != t[o])
    deleted = sorted(o for o in t if o not in s)
    wanted = metadata(src, created + changed) if created or changed else []
    refuse_missing_roles(tgt, wanted, "cutover")
    by_oid = {lo.oid: lo for lo in wanted}
    out = SyncCounts()
    out.bytes += copy_objects(src, tgt, [by_oid[o] for o in created], replace=False).bytes
    out.bytes += copy_objects(src, tgt, [by_oid[o] for o in changed], replace=True).bytes
    out.deleted = unlink(tgt, deleted)
    out.created, out.changed = len(created), len(changed)
    return out


def sync_databases(source_conninfo: str, target_conninfo: str) -> SyncCounts:
    """:func:`sync` on sessions of its own (``applier cutover``, after the catch-up)."""
    purpose = "applier cutover"
    with (
        pgconn.connect(source_conninfo, side="source", purpose=purpose) as src,
        pgconn.connect(target_conninfo, side="target", purpose=purpose) as tgt,
        pgconn.connect(target_conninfo, side="target", purpose=purpose) as tgt_hashing,
    ):
        src.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            counts = sync(src, tgt, tgt_hashing)
        finally:
            src.execute("ROLLBACK")
    log.info("large objects synced", extra={"ctx": {"counts": counts.describe()}})
    return counts


# -- where nothing copies them --------------------------------------------------------

NOT_CARRIED = (
    "the source has {n} large object(s): the stream does not carry them (nor any change "
    "to them); `applier cutover` copies them once writes have stopped (created, changed "
    "and deleted ones), `applier verify` compares them"
)

_said = threading.Event()


def note_not_carried(n: int) -> None:
    """Say once per process that ``n`` large objects exist and what copies them."""
    if n and not _said.is_set():
        _said.set()
        log.warning(NOT_CARRIED.format(n=n))


def count_sql() -> str:
    """The count, as a replication connection takes it (simple query, no parameters)."""
    return "SELECT pg_catalog.count(*) FROM pg_catalog.pg_largeobject_metadata"
