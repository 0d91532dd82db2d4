"""What the terminal shows for a failed step, a failed check and a skipped round (real Dagster runs of small
jobs through the CLI's progress display)."""

from __future__ import annotations

import io
import logging
import re

import dagster as dg

from kernel_assets.cli import _Progress, failure_line
from kregress.core.endpoints import CredentialsError, RequestError


def _logger(handler: _Progress) -> dg.LoggerDefinition:
    @dg.logger
    def progress(_ctx):
        lg = logging.getLogger(f"test.progress.{id(handler)}")
        lg.setLevel(logging.DEBUG)
        lg.propagate = False
        lg.handlers = [handler]
        return lg

    return progress


def _run(job_or_graph, handler: _Progress) -> dg.ExecuteInProcessResult:
    """Run with the CLI's progress display as the only logger (a graph becomes a job with it)."""
    job = job_or_graph.to_job(logger_defs={"progress": _logger(handler)}) if isinstance(job_or_graph, dg.GraphDefinition) \
        else job_or_graph
    with dg.DagsterInstance.ephemeral() as instance:
        return job.execute_in_process(instance=instance, raise_on_error=False, run_config={"loggers": {"progress": {}}})


def _failed_job(exc: Exception):
    def _inner():
        raise exc

    @dg.op(name="round_1_suggestions")
    def suggest():
        try:
            _inner()
        except Exception as inner:  # re-raised from a helper, as the agent does: a cause chain
            raise RuntimeError("the suggest role could not run") from inner

    @dg.graph
    def failing():
        suggest()

    return failing


def test_gateway_error_reaches_the_terminal_as_one_line_with_class_and_fix():
    err = CredentialsError("401 from the gateway for role suggest on keys suggest#1, suggest#2", role="suggest")
    out = io.StringIO()
    handler = _Progress(total_steps=1, stream=out)
    result = _run(_failed_job(err), handler)
    assert not result.success
    lines = [ln for ln in out.getvalue().splitlines() if "FAILED" in ln]
    assert len(lines) == 1, out.getvalue()
    line = lines[0]
    assert "FAILED round_1_suggestions: CredentialsError: [credentials] 401 from the gateway" in line
    assert "Fix: export TAOTOKEN_KEY_<ROLE>" in line
    assert "DagsterExecutionStepExecutionError" not in line
    assert handler.failures == [("round_1_suggestions", line.split("FAILED round_1_suggestions: ")[1])]


def test_classified_error_found_under_a_long_message():
    err = RequestError("model id 'nope' is not served here (served: a, b) " + "x" * 600)
    result = _run(_failed_job(err), _Progress(total_steps=1, stream=io.StringIO()))
    ev = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    line = failure_line(ev.event_specific_data.error)
    assert line.startswith("RequestError: [request] model id 'nope' is not served here") and "Fix: " in line
    assert "\n" not in line


def test_plain_error_shows_the_innermost_cause_not_the_dagster_wrapper():
    result = _run(_failed_job(ZeroDivisionError("division by zero in the cost model")), _Progress(1, io.StringIO()))
    ev = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure_line(ev.event_specific_data.error) == "ZeroDivisionError: division by zero in the cost model"


def test_failed_check_names_variant_and_reason_and_skipped_round_prints_once():
    @dg.asset(check_specs=[dg.AssetCheckSpec("round_2_constraints", asset="round_2_variants")])
    def round_2_variants():
        return dg.MaterializeResult(check_results=[dg.AssetCheckResult(
            check_name="round_2_constraints", passed=False, severity=dg.AssetCheckSeverity.WARN,
            description="r2-local-03: spills 376 B > limit 0 B")])

    @dg.asset(deps=[round_2_variants])
    def round_3_suggestions(context):
        context.log.info("round 3 skipped: max_rounds reached (2)")

    @dg.asset(deps=[round_3_suggestions])
    def round_3_variants():
        return None

    @dg.asset(deps=[round_3_variants])
    def round_3_profiles():
        return None

    @dg.asset(deps=[round_3_profiles])
    def verdict_report():
        return None

    out = io.StringIO()
    handler = _Progress(total_steps=5, stream=out)
    job = dg.Definitions(assets=[round_2_variants, round_3_suggestions, round_3_variants, round_3_profiles, verdict_report],
                         jobs=[dg.define_asset_job("j")], loggers={"progress": _logger(handler)}).resolve_job_def("j")
    assert _run(job, handler).success
    text = out.getvalue()
    assert "check round_2_constraints FAILED (WARN): r2-local-03: spills 376 B > limit 0 B" in text
    assert text.count("round 3 skipped: max_rounds reached (2)") == 1, text
    assert "round_3_suggestions ..." not in text and "round_3_variants" not in text and "round_3_profiles" not in text
    # the numbering stays consecutive: the skipped round takes the numbers of its three steps
    numbers = re.findall(r"\[\s*([\d-]+)/5\]", text)
    assert numbers == ["1", "2-4", "5"], text
    assert "[2-4/5] round 3 skipped: max_rounds reached (2)" in text
