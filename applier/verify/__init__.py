"""``applier verify``: is the target really equal to the source, while writes go on?

* :mod:`.schema`: tables, columns, keys, indexes, constraints, sequences.
* :mod:`.ranges`: the tables, their keys, the key ranges.
* :mod:`.hashing`: the in-server range hashes and the snapshot discipline
  (a source range under a snapshot of known WAL position, the target range
  once it applied up to there).
* :mod:`.task`: one task: ranges hashed on both sides at once, differing
  ones narrowed down to rows (one round trip per level).
* :mod:`.job`: round 1 (the driver's threads while Spark starts, then Spark,
  same Spark settings as the bootstrap), rounds 2..N rechecking the rows.
* :mod:`.largeobjects`: large objects (OIDs, owners, ACLs, data hashes),
  reported as the rows of ``pg_catalog.pg_largeobject``.
* :mod:`.report`: rich / ``--json`` / ``--diff-out`` output.

Sequences behind the source while a worker replicates are "not yet synced"
(copied at cutover), not differences, unless ``--strict-sequences``
(``cutover --verify`` checks strictly, after its sequence sync).

Exit codes: 0 equal, 1 differences found, 2 usage or configuration, 3 the
verify could not complete (a server unreachable, a query failed or timed
out, Spark failed).

Everything heavy (pyspark, psycopg queries) is imported inside
:func:`run_verify`, which ``applier cutover --verify`` calls too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config
    from .report import Report

log = logging.getLogger(__name__)

#: Exit codes of ``applier verify``.
EXIT_EQUAL = 0
EXIT_DIFFERENT = 1


def run_verify(
    cfg: Config,
    *,
    tables: list[str] | None = None,
    chunk_rows: int | None = None,
    rounds: int = 3,
    as_json: bool = False,
    diff_out: Path | None = None,
    quiet: bool = False,
    strict_sequences: bool = False,
) -> int:
    """Compare source and target; print the report; 0 equal, 1 differences.

    Raises :class:`~applier.errors.ConfigError` (exit 2) for bad input and
    :class:`.hashing.VerifyError` (exit 3) when the comparison could not
    complete. ``quiet``: no rich output (``--json`` and ``diff_out`` still
    written). ``strict_sequences``: a sequence behind the source is a
    difference even while a worker replicates (see :func:`.job.verify`).
    """
    from .report import print_json, print_rich, write_diff_lines

    report = compare(
        cfg, tables=tables, chunk_rows=chunk_rows, rounds=rounds,
        strict_sequences=strict_sequences,
    )  # fmt: skip
    if diff_out is not None:
        write_diff_lines(report, diff_out)
    if as_json:
        print_json(report)
    elif not quiet:
        print_rich(report)
    return EXIT_EQUAL if report.equal else EXIT_DIFFERENT


def compare(
    cfg: Config,
    *,
    tables: list[str] | None = None,
    chunk_rows: int | None = None,
    rounds: int = 3,
    strict_sequences: bool = False,
) -> Report:
    """Compare source and target (:func:`run_verify` without the printing): the report.

    ``applier cutover --verify`` names the tables that differ from it.
    """
    from ..errors import ApplierError, ConfigError
    from .hashing import VerifyError
    from .job import verify

    if rounds < 1:
        raise ConfigError("--rounds must be at least 1")
    if chunk_rows is not None and chunk_rows < 100:
        raise ConfigError("--chunk-rows must be at least 100")
    from ..bootstrap.spark import SparkStarter

    # Started while the driver plans and hashes (applier.verify.job); a cluster's
    # executors are checked as soon as it is up.
    spark = SparkStarter(cfg, "verify", check_on_start=True)
    try:
        report = verify(
            cfg,
            spark,
            patterns=tables or None,
            chunk_rows=chunk_rows or cfg.verify.chunk_rows,
            rounds=rounds,
            strict_sequences=strict_sequences,
        )
    except ConfigError:
        raise
    except VerifyError:
        raise
    except ApplierError as e:
        raise VerifyError(f"verify could not complete: {e.message}", hint=e.hint) from None
    except Exception as e:  # psycopg errors of a query (timeout, privileges)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise VerifyError(
            f"verify could not complete: {first}",
            hint="check the error; [verify] statement_timeout bounds every query",
        ) from None
    finally:
        spark.abandon()  # a verify that finished first never waits for a JVM booting
    return report


__all__ = ["compare", "run_verify"]
