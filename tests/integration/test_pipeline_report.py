"""`openhub report` on real Spark (local) against generated SQLite and PostgreSQL stores.

Every figure the Spark job produces is compared with the same aggregation computed by the
database in plain SQL (`pipeline_stores.sql_report`), over the whole store and over a time
range; the HTML page is parsed and its embedded charts decoded; the Parquet tables are read back.
"""

from __future__ import annotations

import base64
import math
from datetime import datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from openhub.core.errors import ConfigurationError

from .pipeline_stores import NOW, generate_store, spark_fixture, sql_report, store_url  # noqa: F401 - spark_fixture is used by name

KEYS = {
    "counts": ("source_system", "route", "state"),
    "route_rates": ("route",),
    "processing_time": ("route",),
    "throughput_hourly": ("hour",),
    "ext_call_failures": ("route", "step_key"),
    "business_errors": ("code",),
    "http_statuses": ("route", "step_key", "status"),
}


def _normal(value: Any) -> Any:
    if isinstance(value, datetime):  # the oracle's hours are text, Spark's are timestamps
        return value.strftime("%Y-%m-%d %H:00")
    return value


def assert_same_table(name: str, spark_rows: list[dict], sql_rows: list[dict]) -> None:
    """Same groups and, group by group, the same figures (floats to a microsecond / 1e-9 relative)."""
    keys = KEYS[name]
    ours = {tuple(_normal(r[k]) for k in keys): r for r in spark_rows}
    theirs = {tuple(_normal(r[k]) for k in keys): r for r in sql_rows}
    assert ours.keys() == theirs.keys(), f"{name}: groups differ"
    for group, expected in theirs.items():
        for column, value in expected.items():
            got = _normal(ours[group][column])
            if isinstance(value, float) or isinstance(got, float):
                assert value is not None and got is not None, (name, group, column, got, value)
                assert math.isclose(got, float(value), rel_tol=1e-9, abs_tol=1e-6), (name, group, column, got, value)
            else:
                assert got == _normal(value), (name, group, column, got, value)


def assert_report_matches(tables: dict[str, list[dict]], oracle: dict[str, list[dict]]) -> None:
    """Every table of a Spark report equals the SQL oracle's."""
    for name in KEYS:
        assert_same_table(name, tables[name], oracle[name])
    assert [r["route"] for r in tables["slowest_routes"]] == [r["route"] for r in oracle["slowest_routes"]]


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self.tables: list[str] = []
        self.external: list[str] = []
        self.title = ""
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images[a.get("data-chart") or ""] = a.get("src") or ""
        if tag in ("table", "p") and a.get("data-table"):
            self.tables.append(a["data-table"] or "")
        if tag in ("script", "link") or (tag == "img" and not (a.get("src") or "").startswith("data:")):
            self.external.append(tag)
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data


@pytest.fixture(scope="module")
def report_store(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """One generated store per backend, shared by the report tests (they only read it)."""
    stores = {}
    contexts = []
    for backend in ("sqlite", "postgresql"):
        ctx = store_url(backend, str(tmp_path_factory.mktemp(f"report-{backend}")))
        url = ctx.__enter__()
        contexts.append(ctx)
        generate_store(url, roots=220, seed=11)
        stores[backend] = url
    yield stores
    for ctx in reversed(contexts):
        ctx.__exit__(None, None, None)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.parametrize(
    "window", [None, (NOW - timedelta(days=3), NOW - timedelta(days=1, hours=5))], ids=["all", "range"]
)
def test_report_figures_equal_sql(spark, report_store, backend, window, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from openhub.pipeline.report import TABLES, build_report
    from openhub.pipeline.source import parse_source

    url = report_store[backend]
    start, end = window or (None, None)
    stages: list[str] = []
    report = build_report(spark, parse_source(url), tmp_path, start, end, stages.append)
    oracle = sql_report(url, start, end)
    assert_report_matches(report.tables, oracle)
    assert report.total("messages") == sum(r["messages"] for r in oracle["counts"]) > 0
    assert len(stages) == len(TABLES) + 1  # progress reported for every stage
    # The Parquet tables on disk hold what the report computed.
    written = spark.read.parquet(str(tmp_path / "route_rates")).collect()
    assert sorted(r.asDict()["route"] for r in written) == sorted(r["route"] for r in oracle["route_rates"])


def test_report_page_is_self_contained_with_charts(spark, report_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """`openhub report` end to end through its click command; the page is parsed, charts decoded."""
    from openhub.pipeline.commands import report

    out = tmp_path / "out"
    result = CliRunner().invoke(
        report,
        [
            "--source",
            report_store["sqlite"],
            "--out",
            str(out),
            "--from",
            "2026-11-01T00:00:00",
            "--to",
            "2026-11-11T00:00:00+00:00",
        ],
    )
    assert result.exit_code == 0, result.output
    page = _Page()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    assert page.title == "openhub message report"
    assert page.external == []  # nothing fetched from elsewhere
    expected = {
        "counts",
        "sources",
        "route_rates",
        "processing_time",
        "throughput_hourly",
        "ext_call_failures",
        "business_errors",
    }
    assert set(page.images) == expected
    for chart, src in page.images.items():
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix), chart
        png = base64.b64decode(src[len(prefix) :], validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000, chart
    assert {
        "counts",
        "route_rates",
        "processing_time",
        "throughput_hourly",
        "ext_call_failures",
        "slowest_routes",
        "business_errors",
        "http_statuses",
    } <= set(page.tables)
    for table in ("counts", "route_rates", "processing_time"):
        assert any(p.name.endswith(".parquet") for p in (out / table).iterdir()), table


def test_report_from_archived_parquet_equals_the_store_before(spark, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Archive a whole store, then report from the Parquet archive: the figures are unchanged."""
    from openhub.pipeline.archive import run_archive
    from openhub.pipeline.report import build_report
    from openhub.pipeline.source import parse_source

    with store_url("sqlite", str(tmp_path)) as url:
        generate_store(url, roots=120, seed=3, archivable_only=True)
        oracle = sql_report(url)
        window = (NOW - timedelta(days=3), NOW - timedelta(days=1, hours=5))
        oracle_in_window = sql_report(url, *window)
        result = run_archive(spark, parse_source(url), tmp_path / "archive", timedelta(0), batch_size=50, now=NOW)
        assert result.messages == sum(r["messages"] for r in oracle["counts"])
        assert sql_report(url)["counts"] == []  # the store is empty now
    archive = parse_source(f"parquet:{tmp_path / 'archive'}")
    assert_report_matches(build_report(spark, archive, tmp_path / "report").tables, oracle)
    # A range reads only the date partitions it needs, and still gives the same figures.
    assert_report_matches(build_report(spark, archive, tmp_path / "ranged", *window).tables, oracle_in_window)


def test_empty_range_gives_empty_tables_and_a_page(spark, report_store, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from openhub.pipeline.page import write_page
    from openhub.pipeline.report import build_report
    from openhub.pipeline.source import parse_source

    report = build_report(
        spark, parse_source(report_store["postgresql"]), tmp_path, datetime(2020, 1, 1), datetime(2020, 1, 2)
    )
    assert all(rows == [] for rows in report.tables.values())
    page = _Page()
    page.feed(write_page(report, tmp_path).read_text(encoding="utf-8"))
    assert len(page.images) == 7


def test_missing_java_or_driver_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from openhub.pipeline import session

    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(ConfigurationError, match="Java not found.*JAVA_HOME"):
        session.find_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"Java not found: install a JRE 17 \(apt-get install openjdk-17"):
        session.find_java()
    monkeypatch.setattr(session, "JAR_DIRS", (tmp_path,))
    expected = "postgresql JDBC driver not found.*libpostgresql-jdbc-java.*--jdbc-jar"
    with pytest.raises(ConfigurationError, match=expected):
        session.find_jdbc_jar("postgresql")
    with pytest.raises(ConfigurationError, match="sqlite JDBC driver not found.*libxerial-sqlite-jdbc-java"):
        session.find_jdbc_jar("sqlite")
    with pytest.raises(ConfigurationError, match="JDBC driver jar not found: /nowhere.jar"):
        session.find_jdbc_jar("sqlite", "/nowhere.jar")


def test_source_specs(tmp_path: Path) -> None:
    from openhub.pipeline.source import parse_source

    assert parse_source("postgresql+psycopg://u:secret@db:6543/hub").jdbc_url() == "jdbc:postgresql://db:6543/hub"
    assert "secret" not in str(parse_source("postgresql+psycopg://u:secret@db:6543/hub"))
    assert parse_source(f"sqlite:///{tmp_path}/x.db").jdbc_url() == f"jdbc:sqlite:{tmp_path}/x.db"
    assert parse_source(f"parquet:{tmp_path}").kind == "parquet"
    assert parse_source(str(tmp_path)).kind == "parquet"
    (tmp_path / "store.db").write_bytes(b"")
    assert parse_source(str(tmp_path / "store.db")).kind == "sqlite"
    with pytest.raises(ConfigurationError, match="source not found"):
        parse_source(str(tmp_path / "missing"))
    with pytest.raises(ConfigurationError, match="unsupported source"):
        parse_source("mysql://x/y")
