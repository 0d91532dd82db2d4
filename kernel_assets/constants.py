"""Names used across the asset graph: partitions, groups, jobs, pools (one place)."""

import dagster as dg

from kregress.core.names import MAX_GRAPH_ROUNDS

# One partition per spec (its task_id). The spec sensor and `kregress sweep` add them.
SPECS_PARTITIONS = dg.DynamicPartitionsDefinition(name="specs")

GROUP_BASELINE = "baseline"
GROUP_ROUNDS = "search_rounds"
GROUP_REPORT = "report"
GROUP_TOKENS = "tokens"

SWEEP_JOB = "sweep_job"

# Shown on every sweep asset in the UI; override per deployment by editing this one line.
OWNERS = ["team:kernel-perf"]

ROUNDS = tuple(range(1, MAX_GRAPH_ROUNDS + 1))
