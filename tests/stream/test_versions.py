"""The version logic (applier.stream.versions) over every major 10..18, without servers:
protocol versions, START_REPLICATION options, slot creation syntax, refusals."""

from __future__ import annotations

import logging

import pytest

from applier.errors import ConfigError
from applier.stream.client import StreamOptions, negotiate
from applier.stream.versions import (
    check_source,
    check_target,
    create_slot_sql,
    features,
    max_proto_version,
    slot_state_sql,
)

MAJORS = range(10, 19)
PROTO = {10: 1, 11: 1, 12: 1, 13: 1, 14: 2, 15: 3, 16: 4, 17: 4, 18: 4}


def sv(major: int, minor: int = 3) -> int:
    return major * 10000 + minor


@pytest.mark.parametrize("major", MAJORS)
def test_protocol_and_features_by_major(major: int) -> None:
    f = features(sv(major))
    assert f.major == major
    assert max_proto_version(sv(major)) == f.proto_version == PROTO[major]
    assert f.streaming == f.binary == f.messages == (major >= 14)
    assert f.two_phase == f.slot_options_syntax == f.publication_filters == (major >= 15)
    assert f.parallel_streaming == f.origin_option == (major >= 16)
    assert f.failover == (major >= 17)
    assert f.slot_wal_status == (major >= 13)
    assert f.slot_two_phase == (major >= 14)
    assert f.generated_columns == (major >= 12)


@pytest.mark.parametrize("major", MAJORS)
def test_create_slot_syntax_by_major(major: int) -> None:
    export = create_slot_sql('"s"', sv(major), snapshot="export", two_phase=True)
    nothing = create_slot_sql('"s"', sv(major), snapshot="nothing", temporary=True)
    if major < 15:
        # The options in parentheses are 15+; two_phase is not decoded before 15.
        assert export == 'CREATE_REPLICATION_SLOT "s" LOGICAL pgoutput EXPORT_SNAPSHOT'
        assert nothing == 'CREATE_REPLICATION_SLOT "s" TEMPORARY LOGICAL pgoutput NOEXPORT_SNAPSHOT'
        assert create_slot_sql('"s"', sv(major), snapshot="use").endswith(" USE_SNAPSHOT")
    else:
        assert export == (
            "CREATE_REPLICATION_SLOT \"s\" LOGICAL pgoutput (SNAPSHOT 'export', TWO_PHASE true)"
        )
        assert (
            nothing
            == "CREATE_REPLICATION_SLOT \"s\" TEMPORARY LOGICAL pgoutput (SNAPSHOT 'nothing')"
        )
    if major >= 17:
        assert create_slot_sql('"s"', sv(major), failover=True).endswith(
            "(SNAPSHOT 'nothing', FAILOVER true)"
        )
    else:
        with pytest.raises(ConfigError, match="failover"):
            create_slot_sql('"s"', sv(major), failover=True)


@pytest.mark.parametrize("major", MAJORS)
def test_check_source_refuses_failover_before_17(major: int) -> None:
    check_source(sv(major), failover=False)
    if major >= 17:
        check_source(sv(major), failover=True)
    else:
        with pytest.raises(ConfigError, match=f"needs PostgreSQL 17.*it runs {major}") as e:
            check_source(sv(major), failover=True)
        assert e.value.exit_code == 2


def test_check_source_refuses_before_10_and_warns_binary(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match="needs 10 or later"):
        check_source(90624, failover=False)
    with caplog.at_level(logging.WARNING, "applier.stream"):
        check_source(sv(13), failover=False, binary=True)
    assert "values come as text" in caplog.text


@pytest.mark.parametrize("major", MAJORS)
def test_check_target_refuses_before_14(major: int) -> None:
    """14 is the oldest target tested on real servers (the 18-14 pair); 10..13 are refused."""
    if major >= 14:
        check_target(sv(major))
        return
    with pytest.raises(ConfigError) as e:
        check_target(sv(major))
    assert e.value.exit_code == 2
    assert f"the target runs PostgreSQL {sv(major)}: applier supports targets 14" in str(e.value)


@pytest.mark.parametrize("major", MAJORS)
def test_slot_state_reads_columns_the_version_has(major: int) -> None:
    q = slot_state_sql(sv(major), "'s'")
    assert (", two_phase," in q) == (major >= 14)
    assert (", failover " in q) == (major >= 17)
    assert q.count(",") == 7  # eight columns whatever the version


@pytest.mark.parametrize("major", MAJORS)
def test_negotiated_options_by_major(major: int, caplog: pytest.LogCaptureFixture) -> None:
    opts = StreamOptions(
        slot="s",
        publications=["p"],
        binary=True,
        streaming="parallel",
        two_phase=True,
        origin="none",
    )
    with caplog.at_level(logging.INFO, "applier.stream"):
        neg = negotiate(sv(major), opts)
    sent = dict(neg.options)
    assert sent["proto_version"] == str(PROTO[major])
    assert ("binary" in sent) == ("messages" in sent) == (major >= 14)
    assert neg.streaming == ("off" if major < 14 else "on" if major < 16 else "parallel")
    assert ("streaming" in sent) == (major >= 14)
    assert neg.two_phase == ("two_phase" in sent) == (major >= 15)
    assert ("origin" in sent) == (major >= 16)
    if major < 14:
        assert "values come as text" in caplog.text
        assert "large transactions are sent at commit" in caplog.text
