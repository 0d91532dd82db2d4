"""kregress.core: spec schema, records, statistics, paths, names, the recorded-file reader and the
family API. No Dagster and no Triton import anywhere below this package (tests/test_layers.py)."""
