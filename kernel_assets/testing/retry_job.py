"""A reconstructable sweep job for tests that re-execute a run from failure (``dg.execute_job`` with
``ReexecutionOptions``): the project's own Definitions, resources and executor, built from the environment
when the job is reconstructed (``KREGRESS_EXECUTOR=in_process`` keeps the steps in the calling process)."""

from __future__ import annotations


def sweep_job():
    from kernel_assets.constants import SWEEP_JOB
    from kernel_assets.definitions import build_definitions, build_resources

    return build_definitions(build_resources()).resolve_job_def(SWEEP_JOB)
