"""What a non-superuser needs for large objects: the refusal names it (one line, exit 3),
and with those grants the copy really works, owners and ACLs included."""

from __future__ import annotations

import psycopg
import pytest
from bootstrap.test_privileges import add_role, grants_for
from conftest import Pair

from applier import largeobjects as lo
from applier import pgconn
from applier.privileges import MissingPrivileges, check, scope_of
from largeobjects.lokit import roles, state

# The target role's checks, on a target without a schema another role made.
pytestmark = pytest.mark.bare_target


def test_large_objects_need_select_on_the_source_and_the_owners_on_the_target(
    pair: Pair,
) -> None:
    with roles(pair, 2) as r:
        pair.pub_exec(
            "SELECT lo_from_bytea(60001, 'one'::bytea);"
            f"ALTER LARGE OBJECT 60001 OWNER TO {r[0]};"
            f"GRANT SELECT ON LARGE OBJECT 60001 TO {r[1]};"
        )
        src_role = add_role(pair, "pub", "CREATE ROLE {r} LOGIN")
        tgt_role = add_role(pair, "sub", "CREATE ROLE {r} LOGIN")
        src_dsn, tgt_dsn = (
            pair.pub.dsn(pair.pub_db, user=src_role),
            pair.sub.dsn(pair.sub_db, user=tgt_role),
        )
        with (
            psycopg.connect(src_dsn, autocommit=True) as src,
            psycopg.connect(tgt_dsn, autocommit=True) as tgt,
        ):
            scope = scope_of(src, [])
            assert list(scope.large_object_roles) == [r[0]]
            with pytest.raises(MissingPrivileges) as refused:
                check("cutover", scope, source=src, target=tgt)
        line = str(refused.value)
        src_grants, tgt_grants = grants_for(line, "source"), grants_for(line, "target")
        assert src_grants == f'ALTER ROLE "{src_role}" SET lo_compat_privileges = on;', line
        assert f'GRANT "{r[0]}" TO "{tgt_role}";' in tgt_grants, line
        pair.pub_exec(src_grants)
        pair.sub_exec(tgt_grants)
        # New sessions, pinned as applier's (the role setting applies at login): the
        # check passes, and the copy works.
        with (
            pgconn.connect(src_dsn, side="source", purpose="test") as src,
            pgconn.connect(tgt_dsn, side="target", purpose="test") as tgt,
        ):
            check("cutover", scope_of(src, []), source=src, target=tgt)
            lo.copy_objects(src, tgt, lo.metadata(src), replace=False)
        assert state(pair, "sub") == state(pair, "pub")
