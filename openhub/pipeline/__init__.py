"""The data pipeline on Spark (openhub/pipeline/README.md): `openhub report` and `openhub archive`.

Only this package imports pyspark, and only inside functions, so `import openhub` and even
`import openhub.pipeline` work without the `spark` extra. The modules:

- `session`: the SparkSession, locating Java and the JDBC drivers (clear errors when missing);
- `source`: where messages come from (PostgreSQL or SQLite through JDBC, or an archive in Parquet)
  and the one canonical column layout shared by every source;
- `report` with `charts` and `page`: the aggregations, their PNG charts and the HTML page;
- `archive` with `ledger`: moving final messages to Parquet and out of the database, resumably;
- `commands`: the click commands `report` and `archive` that `openhub.cli` mounts.
"""
