"""Which Spark master a pipeline job runs on, and how its PostgreSQL reads are cut (issue 41)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from openhub.core.errors import ConfigurationError
from openhub.pipeline.commands import pipeline
from openhub.pipeline.session import spark_master
from openhub.pipeline.source import ReadSettings, read_settings


def test_master_comes_from_the_option_then_the_setting_then_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENHUB_SPARK_MASTER", raising=False)
    assert spark_master() == "local[*]"
    monkeypatch.setenv("OPENHUB_SPARK_MASTER", "spark://spark-master:7077")
    assert spark_master() == "spark://spark-master:7077"
    assert spark_master("local[2]") == "local[2]"
    assert spark_master("k8s://https://api:6443") == "k8s://https://api:6443"


def test_an_unknown_master_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENHUB_SPARK_MASTER", "master:7077")
    with pytest.raises(ConfigurationError, match="unsupported Spark master 'master:7077'"):
        spark_master()


def test_reads_are_cut_into_bounded_ranges() -> None:
    settings = ReadSettings(rows_per_partition=100_000, max_partitions=64)
    assert settings.partitions(0) == 1
    assert settings.partitions(99_999) == 1
    assert settings.partitions(100_001) == 2  # no range holds more than rows_per_partition (dense ids)
    assert settings.partitions(1_000_000) == 10
    assert settings.partitions(1_000_000_000) == 64  # the cap: no more connections than that per table


def test_read_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENHUB_SPARK_JDBC_PARTITION_ROWS", "5000")
    monkeypatch.setenv("OPENHUB_SPARK_JDBC_PARTITIONS", "4")
    monkeypatch.setenv("OPENHUB_SPARK_JDBC_FETCHSIZE", "500")
    assert read_settings() == ReadSettings(5000, 4, 500)
    monkeypatch.setenv("OPENHUB_SPARK_JDBC_PARTITIONS", "0")
    with pytest.raises(ConfigurationError, match="OPENHUB_SPARK_JDBC_PARTITIONS must be a positive"):
        read_settings()


def test_archive_refuses_an_object_store_url_before_starting_spark(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(
        pipeline,
        [
            "archive",
            "--older-than",
            "30d",
            "--out",
            "s3a://bucket/archive",
            "--source",
            f"sqlite:///{tmp_path}/none.db",
        ],
    )
    assert result.exit_code == 2
    assert "--out must be a directory every executor and the driver can write" in result.output
