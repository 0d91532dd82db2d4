"""Deployment configuration: the Dagster instance for PostgreSQL and the executor for Kubernetes."""
