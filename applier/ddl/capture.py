"""The source's DDL capture: an event trigger emitting each statement as an ``applier.ddl`` message.

What ``applier ddl install`` creates
====================================

In the source database, all of it owned by the installing role (a superuser:
PostgreSQL 15 to 18 let only a superuser create an event trigger):

* the schema ``applier_ddl`` (``USAGE`` for everyone: the trigger runs as
  whoever runs the DDL, and calls its functions by name);
* the unlogged table ``applier_ddl.subxact``, always empty (see "Its
  subtransaction");
* ``applier_ddl.version()``: the version of what is installed
  (:data:`CAPTURE_VERSION`), so that a later applier knows what it upgrades;
* ``applier_ddl.sql_drop(tag)`` and ``applier_ddl.command_end(tag, search_path)``:
  the capture itself (``SET search_path = pg_catalog, pg_temp``: no object on
  the user's path is ever called). ``command_end`` is ``SECURITY DEFINER``:
  it asks ``pg_replication_origin_session_is_setup()`` (a superuser's) and
  signs and emits as its owner (see "Who may write a message"). It takes no
  content: the statement is ``current_query()`` and the objects are what the
  event trigger functions report, so calling it can only emit the DDL being run;
* the key, and the functions that sign and verify with it (see "Who may write
  a message");
* two event triggers, ``applier_ddl_sql_drop`` (``sql_drop``) and
  ``applier_ddl_command_end`` (``ddl_command_end``), whose functions only call
  the two above and swallow any error.

One statement, one message
==========================

``sql_drop`` fires first, for statements that drop something (``DROP ...``,
``ALTER TABLE ... DROP COLUMN``): it adds what was dropped to a
transaction-local setting (``applier_ddl.dropped``). ``ddl_command_end``
then takes what ``pg_event_trigger_ddl_commands()`` reports, adds the
dropped objects, clears the setting and emits one transactional message
(``pg_logical_emit_message(true, 'applier.ddl', ...)``, its JSON as
:mod:`applier.ddl.message` defines it, via ``trigger``) at the statement's
position in its transaction. So a DROP that fires both triggers is one
message, whose objects say ``dropped``.

The objects: each one ``pg_event_trigger_ddl_commands()`` names (once), and
of the dropped ones those the statement named, and those with a name of their
own (tables, views, types, ...) that went with them through a normal
dependency (``CASCADE``); not the
row and array types, TOAST tables, indexes, defaults and constraints that go
with every table (``object_name`` is null for the parts of a table), nor an
extension's members (``DROP EXTENSION`` names the extension).

What is never emitted
=====================

* Temporary objects (``pg_temp`` schemas): a statement that touched only
  temporary objects emits nothing; one that touched others as well emits
  those others.
* applier's own: the ``applier`` schema (two-way setups have it on the
  source too) and ``applier_ddl``.
* The statements of an extension's script: each fires the trigger, with
  objects ``in_extension``; the ``CREATE`` (or ``ALTER``) ``EXTENSION``
  that ran them is the one message.
* DDL run by a session with a replication origin set up
  (``pg_replication_origin_session_is_setup()``): what a replication worker
  applied, applier's included, is not sent back (two-way setups). Sessions
  with ``session_replication_role = replica`` (applier's worker, PostgreSQL's
  apply workers) do not fire the triggers at all (they are ``ENABLE``d for
  origin sessions, the default).
* A transaction that set ``applier_ddl.capture`` to ``off``
  (``SET LOCAL applier_ddl.capture = off``: a change meant for the source
  only) or to ``run`` (``applier ddl run``, which emits the statement
  itself; the trigger leaves it the objects it found, in
  ``applier_ddl.run_objects``).
* Statements without event triggers: those on databases, roles and
  tablespaces (shared objects), and anything while event triggers are off
  (``event_triggers = off``, PostgreSQL 17+; single-user mode).

In its place
============

The message must reach the worker between the changes it was written
between. Logical decoding orders a transaction's changes by LSN, merging its
subtransactions' lists, and queues a message at the LSN where its record
*ends* (``decode.c``, ``logicalmsg_decode``: ``buf->endptr``), which is where
the next record starts. The capture runs in a subtransaction (the
``EXCEPTION`` block below; the user's ``SAVEPOINT`` makes one too), so when the
transaction's next change is the very next record, the two tie and the
merge may send the change first (seen on 15 and 18: ``ALTER TABLE ... ADD
COLUMN`` then an ``INSERT`` decoded as INSERT, message;
``tests/ddl/test_capture.py`` fails without the pad). So right after it the
capture writes an empty transactional message of its own prefix
(:data:`PAD_PREFIX`, ignored by the worker, as is any prefix but
``applier.ddl``): that one may tie, the captured message no longer can.

Its subtransaction
==================

A transaction large enough to be streamed reaches the worker in blocks before
it commits, and a ``ROLLBACK TO SAVEPOINT`` then arrives as a Stream Abort
naming the subtransaction's xid (and one for each of its children that had
changes): the worker drops what that subtransaction sent, from its first
change on (:mod:`applier.apply.handlers.spool`). A row change carries the xid
of its subtransaction, but pgoutput sends a message with the top-level xid
(``pgoutput_message``: ``txn->xid`` of the transaction being streamed; seen
on 15 and 18), so the worker could not tell that the message belonged to the
rolled-back savepoint. The message is written in the ``EXCEPTION`` block's
own subtransaction (``C``, a child of the user's savepoint ``S``, or of the
top level), and ``C`` has changes (the message), so a rollback of ``S``
sends a Stream Abort for ``C`` too, before ``S``'s (``DecodeAbort``: children
first); a rollback of the capture alone (an error after the message was
written) names ``C`` as well. So ``command_end`` writes ``C``'s xid in the
message (key ``subxact``): the ``xmin`` of a row it inserts into (and
deletes from) the unlogged table ``applier_ddl.subxact``, which is
``GetCurrentTransactionId()`` of ``C``, the xid the message's record has. The
worker spools the message under that xid: a Stream Abort of ``C`` truncates
the spool where the message is, which is exactly what the source rolled back
(everything after a subtransaction's first change is it or its descendants).
A message without the key is kept under the top-level xid: exact for
``applier ddl run`` (its statement is a transaction of its own), not for a
capture before version 2 (``status`` says ``applier ddl install`` upgrades it).

Who may write a message
=======================

The worker runs what an ``applier.ddl`` message says, and any role that may
call ``pg_logical_emit_message`` (``PUBLIC`` may, by default) can write one.
So each message is signed (see "Signed" in :mod:`applier.ddl.message`) and
the worker runs only those the source's ``applier_ddl.verify`` says are
signed with the key (:mod:`applier.apply.handlers.ddlsig`):

* ``applier_ddl.key``: the key, 32 random bytes (two ``gen_random_uuid()``,
  built in from PostgreSQL 13; pgcrypto may be absent), one row, no grant:
  its owner's (and superusers'). The table is ``UNLOGGED``: a logged row would
  be in the WAL, so in every ``FOR ALL TABLES`` publication's stream (to the
  worker, and to a two-way target's own key). A crash empties it;
  ``applier_ddl.secret()`` makes a new key at the next DDL (messages signed
  with the old one and not yet applied then stop the worker, with their skip).
  ``install`` over an older capture keeps the key (messages already in the
  stream still verify) and the roles granted ``emit_run``;
* ``applier_ddl.hmac(key, msg)``: HMAC-SHA256 (RFC 2104) from the built-in
  ``sha256()``; ``applier_ddl.signed(body)``: the content, as
  :func:`applier.ddl.message.signed` builds it (``tests/ddl/test_sign.py``);
  neither is ``PUBLIC``'s;
* ``command_end`` (``SECURITY DEFINER``) signs what it emits;
  ``applier_ddl.emit_run(body)`` (``SECURITY DEFINER``, ``EXECUTE`` for the
  roles ``install --run-role`` names) signs and emits ``applier ddl run``'s;
* ``applier_ddl.verify(body, sig)`` (``SECURITY DEFINER``, everyone's): yes or
  no, compared through one more hash (no timing of how much of a guess matched).

What the capture emits is still what the source's users ran, replayed with
the worker's privileges on the target.

Never in the way of the user's DDL
==================================

An error raised in an event trigger aborts the statement that fired it.
The trigger functions catch every error of the capture and turn it into a
``WARNING`` naming the statement that was not captured (PL/pgSQL's
``EXCEPTION`` block: a subtransaction, nothing of the failed capture stays),
so the user's DDL goes on; the statement then never reaches the target,
which the worker finds when a later change does not fit. A cancel
(``query_canceled``) is not caught: the user asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from . import message

#: The version of the SQL this module installs; bump it when the SQL changes, so
#: that ``install`` on an older one says it upgrades and ``status`` shows it.
CAPTURE_VERSION = 2
SCHEMA = "applier_ddl"
#: The event triggers, by event.
TRIGGERS = {"ddl_command_end": "applier_ddl_command_end", "sql_drop": "applier_ddl_sql_drop"}
#: Schemas whose objects are never captured: applier's on either side.
OWN_SCHEMAS = ("applier", SCHEMA)
#: Transaction-local settings: what ``sql_drop`` collected for ``ddl_command_end``;
#: the mode (``off``, ``run``) a transaction asked for; the objects left for ``ddl run``.
DROPPED = "applier_ddl.dropped"
MODE = "applier_ddl.capture"
RUN_OBJECTS = "applier_ddl.run_objects"

#: The empty message written right after each captured one (see "In its place").
PAD_PREFIX = "applier.ddl-pad"

Conn = psycopg.Connection[Any]

#: Whether an object is temporary, by its schema (the session's own is named
#: ``pg_temp`` in what event triggers report, another session's ``pg_temp_N``) or
#: its identity: an object without a schema of its own names its table's
#: (a temporary view's rule: ``"_RETURN" on pg_temp.v``).
_TEMP = (
    "(coalesce({s} = 'pg_temp' OR {s} ~ '^pg_(toast_)?temp_[0-9]+$', false) "
    "OR {i} ~ '(^| on )pg_(toast_)?temp(_[0-9]+)?\\.')"
)

_FUNCTIONS = """
-- Never published, never in WAL: a row written and deleted per message, for its xmin.
CREATE UNLOGGED TABLE {schema}.subxact ();

CREATE FUNCTION {schema}.version() RETURNS integer LANGUAGE sql IMMUTABLE
AS 'SELECT {capture_version}';

-- The signing (see "Signed" in applier.ddl.message): HMAC-SHA256 (RFC 2104) from
-- the built-in sha256(), so that neither pgcrypto nor any extension is needed.
CREATE FUNCTION {schema}.hmac(key bytea, msg bytea) RETURNS bytea LANGUAGE plpgsql
IMMUTABLE STRICT SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  k bytea := CASE WHEN octet_length(key) > 64 THEN sha256(key) ELSE key END;
  ipad bytea;
  opad bytea;
BEGIN
  k := k || decode(repeat('00', 64 - octet_length(k)), 'hex');
  ipad := k;
  opad := k;
  FOR i IN 0..63 LOOP
    ipad := set_byte(ipad, i, get_byte(k, i) # 54);  -- 0x36
    opad := set_byte(opad, i, get_byte(k, i) # 92);  -- 0x5c
  END LOOP;
  RETURN sha256(opad || sha256(ipad || msg));
END
$body$;

-- The key, made when missing (see "Who may write a message" in applier.ddl.capture:
-- a crash empties its unlogged table). Its owner's (and the SECURITY DEFINER
-- functions') only, as is signed().
CREATE FUNCTION {schema}.secret() RETURNS bytea LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  secret bytea := (SELECT k.k FROM {schema}.key k);
BEGIN
  IF secret IS NULL THEN
    INSERT INTO {schema}.key (k) SELECT {new_key} ON CONFLICT DO NOTHING;
    secret := (SELECT k.k FROM {schema}.key k);
  END IF;
  RETURN secret;
END
$body$;
REVOKE EXECUTE ON FUNCTION {schema}.secret() FROM PUBLIC;

-- A body's signed content: applier.ddl.message.signed, in SQL.
CREATE FUNCTION {schema}.signed(body bytea) RETURNS bytea LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  secret bytea := {schema}.secret();
BEGIN
  RETURN convert_to('{{"sig":"' || encode({schema}.hmac(secret, body), 'hex') || '",', 'UTF8')
    || substr(body, 2);
END
$body$;
REVOKE EXECUTE ON FUNCTION {schema}.signed(bytea) FROM PUBLIC;

-- Whether sig is the key's signature of body (null: no key). Everyone's: it tells
-- only yes or no. Compared through one more hash, so that the comparison's time
-- says nothing of how much of a guess was right.
CREATE FUNCTION {schema}.verify(body bytea, sig text) RETURNS boolean LANGUAGE plpgsql
STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  secret bytea := (SELECT k.k FROM {schema}.key k);
BEGIN
  IF secret IS NULL THEN
    RETURN NULL;
  END IF;
  RETURN sha256(convert_to(encode({schema}.hmac(secret, body), 'hex'), 'UTF8'))
    = sha256(convert_to(sig, 'UTF8'));
END
$body$;

-- applier ddl run's emit: signed as its owner, for the roles granted it (none but
-- the owner and superusers unless install --run-role or a GRANT says so).
CREATE FUNCTION {schema}.emit_run(body bytea) RETURNS pg_lsn LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
BEGIN
  IF (convert_from(body, 'UTF8')::jsonb ->> 'via') IS DISTINCT FROM 'run' THEN
    RAISE EXCEPTION 'emit_run emits applier ddl run''s messages only (via run)';
  END IF;
  RETURN pg_logical_emit_message(true, {prefix}, {schema}.signed(body));
END
$body$;
REVOKE EXECUTE ON FUNCTION {schema}.emit_run(bytea) FROM PUBLIC;

-- The objects of a list to emit, and whether any was left out (temporary, made by
-- an extension's script, or applier's own).
CREATE FUNCTION {schema}.keep(objs jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $body$
SELECT jsonb_build_object(
  'objects', coalesce(jsonb_agg(o - 'skip' ORDER BY n) FILTER (WHERE NOT skip), '[]'),
  'skipped', coalesce(bool_or(skip), false))
FROM (
  SELECT o, n, coalesce((o ->> 'skip')::boolean, false)
      OR coalesce(o ->> 'schema' = ANY ({own}), false)
      OR (o ->> 'schema' IS NULL AND o ->> 'kind' = 'schema' AND o ->> 'identity' = ANY ({own}))
      AS skip
  FROM jsonb_array_elements(objs) WITH ORDINALITY AS x(o, n)
) y
$body$;

-- An extension's members count as normal dependents: DROP EXTENSION names itself only.
CREATE FUNCTION {schema}.sql_drop(tag text) RETURNS void LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  earlier jsonb := coalesce(nullif(current_setting({dropped}, true), '')::jsonb, '[]');
  these jsonb;
BEGIN
  SELECT coalesce(jsonb_agg(jsonb_build_object(
      'kind', d.object_type, 'schema', d.schema_name, 'identity', d.object_identity,
      'dropped', true, 'skip', d.is_temporary OR {temp_dropped})
      ORDER BY d.ordinality), '[]')
    INTO these
    FROM pg_event_trigger_dropped_objects() WITH ORDINALITY AS d
    WHERE (d.original OR (d.normal AND d.object_name IS NOT NULL AND tag <> 'DROP EXTENSION'))
      AND d.object_identity IS NOT NULL;
  PERFORM set_config({dropped}, (earlier || these)::text, true);
END
$body$;

CREATE FUNCTION {schema}.command_end(tag text, path text) RETURNS void LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
  dropped jsonb := coalesce(nullif(current_setting({dropped}, true), '')::jsonb, '[]');
  mode text := coalesce(current_setting({mode}, true), '');
  made jsonb;
  kept jsonb;
  statement text := current_query();
  mark tid;
  subxact xid;
BEGIN
  PERFORM set_config({dropped}, '', true);
  IF mode = 'off' OR pg_replication_origin_session_is_setup() THEN
    RETURN;
  END IF;
  SELECT coalesce(jsonb_agg(o ORDER BY n), '[]') INTO made FROM (
    SELECT DISTINCT ON (c.object_type, c.object_identity)
      jsonb_build_object('kind', c.object_type, 'schema', c.schema_name,
        'identity', c.object_identity, 'dropped', false,
        'skip', c.in_extension OR {temp}) AS o,
      c.ordinality AS n
    FROM pg_event_trigger_ddl_commands() WITH ORDINALITY AS c
    WHERE c.object_identity IS NOT NULL
    ORDER BY c.object_type, c.object_identity, c.ordinality) x;
  kept := {schema}.keep(made || dropped);
  IF mode = 'run' THEN
    PERFORM set_config({run_objects}, kept::text, true);
    RETURN;
  END IF;
  IF (kept ->> 'skipped')::boolean AND jsonb_array_length(kept -> 'objects') = 0 THEN
    RETURN;
  END IF;
  IF statement IS NULL THEN
    RAISE EXCEPTION 'the statement''s text is not known (current_query() is null)';
  END IF;
  -- See "Its subtransaction" in applier.ddl.capture: the xid the message is written
  -- in, which pgoutput does not send with it (xmin of a row written here is it).
  INSERT INTO {schema}.subxact DEFAULT VALUES RETURNING ctid, xmin INTO mark, subxact;
  DELETE FROM {schema}.subxact WHERE ctid = mark;
  PERFORM pg_logical_emit_message(true, {prefix}, {schema}.signed(convert_to(jsonb_build_object(
    'v', {message_version}, 'tag', tag, 'statement', statement, 'search_path', path,
    'objects', kept -> 'objects', 'via', 'trigger',
    'subxact', subxact::text::bigint)::text, 'UTF8')));
  -- See "In its place" in applier.ddl.capture: the next change must not start
  -- where the message ends.
  PERFORM pg_logical_emit_message(true, {pad_prefix}, ''::bytea);
END
$body$;

-- The event triggers' own functions: no SET clause (it would hide the user's
-- search_path from command_end), every name qualified, every error a WARNING.
CREATE FUNCTION {schema}.on_ddl_command_end() RETURNS event_trigger LANGUAGE plpgsql
AS $body$
BEGIN
  PERFORM {schema}.command_end(tg_tag, pg_catalog.current_setting('search_path'));
EXCEPTION WHEN OTHERS THEN
  PERFORM pg_catalog.set_config({dropped}, '', true);
  RAISE WARNING 'applier: this % was not captured for the target: %', tg_tag, sqlerrm
    USING HINT = 'the statement ran on the source; run it on the target by hand '
                 '(or with applier ddl run), else the worker stops where a change needs it';
END
$body$;

CREATE FUNCTION {schema}.on_sql_drop() RETURNS event_trigger LANGUAGE plpgsql
AS $body$
BEGIN
  PERFORM {schema}.sql_drop(tg_tag);
EXCEPTION WHEN OTHERS THEN
  RAISE WARNING 'applier: what this % dropped was not captured for the target: %', tg_tag, sqlerrm;
END
$body$;
"""


def _install_sql() -> sql.Composed:
    """The whole capture, as one script (run in one transaction)."""
    own = sql.SQL("ARRAY[{}]::text[]").format(sql.SQL(", ").join(map(sql.Literal, OWN_SCHEMAS)))
    schema = sql.Identifier(SCHEMA)
    functions = sql.SQL(_FUNCTIONS).format(
        schema=schema,
        capture_version=sql.SQL(str(CAPTURE_VERSION)),
        own=own,
        dropped=sql.Literal(DROPPED),
        mode=sql.Literal(MODE),
        run_objects=sql.Literal(RUN_OBJECTS),
        temp=sql.SQL(_TEMP.format(s="c.schema_name", i="c.object_identity")),
        temp_dropped=sql.SQL(_TEMP.format(s="d.schema_name", i="d.object_identity")),
        prefix=sql.Literal(message.PREFIX),
        pad_prefix=sql.Literal(PAD_PREFIX),
        message_version=sql.SQL(str(message.VERSION)),
        new_key=sql.SQL(_NEW_KEY),
    )
    triggers = [
        sql.SQL("CREATE EVENT TRIGGER {} ON {} EXECUTE FUNCTION {}.{}()").format(
            sql.Identifier(name), sql.SQL(event), schema, sql.Identifier(f"on_{event}")
        )
        for event, name in TRIGGERS.items()
    ]
    comment = (
        f"applier: DDL capture version {CAPTURE_VERSION} (applier ddl install); "
        "applier ddl uninstall removes it"
    )
    return sql.SQL(";\n").join(
        [
            sql.SQL("CREATE SCHEMA {}").format(schema),
            sql.SQL("COMMENT ON SCHEMA {} IS {}").format(schema, sql.Literal(comment)),
            sql.SQL("GRANT USAGE ON SCHEMA {} TO PUBLIC").format(schema),
            # Its owner's only (no grant): read through signed() and verify().
            sql.SQL(
                "CREATE UNLOGGED TABLE {}.key (one boolean PRIMARY KEY DEFAULT true CHECK (one), "
                "k bytea NOT NULL CHECK (pg_catalog.octet_length(k) = 32))"
            ).format(schema),
            functions,
            *triggers,
        ]
    )


@dataclass(frozen=True)
class State:
    """What of the capture a source database has."""

    #: The schema exists; ``ours``: with the comment ``install`` gives it (a schema of
    #: that name without it is someone else's, never dropped).
    schema: bool
    ours: bool
    #: ``applier_ddl.version()``'s answer (None: no such function, or no schema).
    version: int | None
    #: The event triggers that exist, by name: ``evtenabled`` (``O`` origin and
    #: local sessions, the default; ``D`` disabled; ``R`` replica; ``A`` always).
    triggers: dict[str, str]

    @property
    def installed(self) -> bool:
        return self.version is not None and set(self.triggers) == set(TRIGGERS.values())

    @property
    def enabled(self) -> bool:
        return self.installed and all(e in ("O", "A") for e in self.triggers.values())

    def describe(self) -> str:
        """One line for ``applier status``."""
        if not self.schema and not self.triggers:
            return "not installed (applier ddl install captures DDL)"
        if self.version is None or not self.installed:
            return "partly installed: applier ddl install repairs it, uninstall removes it"
        text = f"installed, version {self.version}"
        if self.version < CAPTURE_VERSION:
            text += f" (applier ddl install upgrades it to {CAPTURE_VERSION})"
        elif self.version > CAPTURE_VERSION:
            text += f" (newer than this applier's {CAPTURE_VERSION})"
        if not self.enabled:
            text += "; event triggers disabled: " + ", ".join(
                f"{n} {e}" for n, e in sorted(self.triggers.items())
            )
        return text

    def as_dict(self) -> dict[str, Any]:
        """``applier status --json``'s ``ddl_capture``."""
        return {
            "installed": self.installed,
            "version": self.version,
            "enabled": self.enabled,
            "current_version": CAPTURE_VERSION,
            "summary": self.describe(),
        }


_STATE = """
SELECT n.oid IS NOT NULL,
  coalesce(pg_catalog.obj_description(n.oid, 'pg_namespace') LIKE 'applier: DDL capture %%', false),
  pg_catalog.to_regprocedure(%s) IS NOT NULL,
  ARRAY(SELECT e.evtname::text FROM pg_catalog.pg_event_trigger e
        WHERE e.evtname = ANY (%s) ORDER BY 1),
  ARRAY(SELECT e.evtenabled::text FROM pg_catalog.pg_event_trigger e
        WHERE e.evtname = ANY (%s) ORDER BY e.evtname)
FROM (SELECT 1) one
LEFT JOIN pg_catalog.pg_namespace n ON n.nspname = %s
"""


def state(conn: Conn) -> State:
    """What of the capture ``conn``'s database has (read only)."""
    names = list(TRIGGERS.values())
    version_fn = f"{SCHEMA}.version()"
    row = conn.execute(_STATE, (version_fn, names, names, SCHEMA)).fetchone()
    assert row is not None
    has_schema, ours, has_version, trigger_names, enabled = row
    version = None
    if has_version:
        got = conn.execute(sql.SQL("SELECT {}.version()").format(sql.Identifier(SCHEMA)))
        version = int(got.fetchone()[0])  # type: ignore[index]
    triggers = dict(zip(trigger_names, enabled, strict=True))
    return State(bool(has_schema), bool(ours), version, triggers)


def _drop(conn: Conn, *, schema: bool) -> None:
    for name in TRIGGERS.values():
        conn.execute(sql.SQL("DROP EVENT TRIGGER IF EXISTS {}").format(sql.Identifier(name)))
    if schema:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(SCHEMA)))


def install(conn: Conn, before: State, run_roles: tuple[str, ...] = ()) -> None:
    """Create the capture (replacing what ``before`` found) in one transaction.

    A replaced capture's key stays (see "The key"), and so do the roles granted
    ``emit_run``; ``run_roles`` are granted it too.

    The event triggers go first and come back last: nothing of the
    install fires the capture (it would be in ``applier_ddl``, ignored
    anyway), and a concurrent session sees either the old capture or the
    new one, never none.
    """
    with conn.transaction():
        # Its own GRANTs run after the new triggers: not for the stream.
        conn.execute("SELECT pg_catalog.set_config(%s, 'off', true)", (MODE,))
        key, granted = _kept(conn) if before.ours else (None, [])
        if before.schema or before.triggers:
            _drop(conn, schema=before.ours)
        conn.execute(_install_sql())
        conn.execute(
            sql.SQL("INSERT INTO {}.key (k) VALUES (coalesce(%s, {}))").format(
                sql.Identifier(SCHEMA), sql.SQL(_NEW_KEY)
            ),
            (key,),
        )  # unlogged: not in the WAL, so never in a publication's stream
        for role in dict.fromkeys([*granted, *run_roles]):
            conn.execute(
                sql.SQL("GRANT EXECUTE ON FUNCTION {}.emit_run(bytea) TO {}").format(
                    sql.Identifier(SCHEMA), sql.Identifier(role)
                )
            )


#: 32 random bytes from two version 4 UUIDs (244 random bits; pg_strong_random):
#: gen_random_uuid() is built in from PostgreSQL 13, pgcrypto may be absent.
_NEW_KEY = (
    "pg_catalog.decode(pg_catalog.replace(pg_catalog.gen_random_uuid()::text "
    "|| pg_catalog.gen_random_uuid()::text, '-', ''), 'hex')"
)

#: The roles granted ``emit_run`` (besides its owner), to grant again on a reinstall.
_GRANTED = """
SELECT r.rolname FROM pg_catalog.pg_proc p,
  pg_catalog.aclexplode(p.proacl) a JOIN pg_catalog.pg_roles r ON r.oid = a.grantee
WHERE p.oid = pg_catalog.to_regprocedure(%s) AND a.privilege_type = 'EXECUTE'
  AND a.grantee <> p.proowner ORDER BY 1
"""


def _kept(conn: Conn) -> tuple[bytes | None, list[str]]:
    """What a reinstall keeps: the key (messages in the stream signed with it still
    verify) and who was granted ``emit_run``."""
    key = None
    if conn.execute("SELECT pg_catalog.to_regclass(%s)", (f"{SCHEMA}.key",)).fetchone() != (None,):
        row = conn.execute(sql.SQL("SELECT k FROM {}.key").format(sql.Identifier(SCHEMA)))
        key = next(iter(row.fetchone() or ()), None)
    granted = conn.execute(_GRANTED, (f"{SCHEMA}.emit_run(bytea)",)).fetchall()
    return key, [str(r[0]) for r in granted]


def uninstall(conn: Conn, before: State) -> None:
    """Remove the event triggers and the schema (when ours), in one transaction."""
    with conn.transaction():
        _drop(conn, schema=before.ours)
