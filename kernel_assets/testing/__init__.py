"""Harnesses the tests and benchmarks share that need the application layer (Dagster, a shared instance)."""
