"""Alembic environment for the applier's own schema on the target.

Everything applier keeps on the target lives in the ``applier`` schema,
alembic's version table included. Autogenerate is fenced to that schema so it
never proposes to touch the user's replicated tables. The connection is handed
in by ``applier.schema`` (``config.attributes["connection"]``); there is no
URL in alembic.ini, so no password is ever written to a file.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy import MetaData

SCHEMA = "applier"
target_metadata = MetaData(schema=SCHEMA)


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    if type_ == "schema":
        return name == SCHEMA
    return parent_names.get("schema_name") == SCHEMA


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "run migrations through `applier migrate`, which supplies the connection"
        )
    connection.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=include_name,
        transaction_per_migration=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) mode is not supported; use `applier migrate`")
run_migrations_online()
