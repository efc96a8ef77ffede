"""Where the job's rows are kept: ``location`` (a local directory or an fsspec URI, atomic whole-file
writes), ``shards`` (the sharded Parquet store: commit log, manifest, checksums, compaction), ``knowledge``
(the knowledge rows on it), ``lock`` (one writer per output, local or an object-store lease) and ``frames``
(Arrow tables as polars frames)."""
