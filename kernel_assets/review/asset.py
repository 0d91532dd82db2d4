"""The Dagster asset kernel_source_review (partitioned by spec) and its check kernel_review_clean."""

import warnings

import dagster as dg
from pydantic import Field

from kernel_assets.constants import OWNERS, SPECS_PARTITIONS
from kernel_assets.review.records import ReviewError, ReviewFinding
from kernel_assets.review.report import compile_markdown, coverage_markdown
from kernel_assets.review.run import ASSET_NAME, DEFAULT_SLICE_CHARS, run_review
from kernel_assets.specs_resource import SpecStore
from resources.ledger import LedgerResource
from resources.taotoken import GatewayError, TaotokenResource

GROUP_REVIEW = "review"
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")  # a preview API, nothing to act on
CHECK_NAME = "kernel_review_clean"


class ReviewConfig(dg.Config):
    """Launchpad options of kernel_source_review."""

    base_ref: str = Field(default="", description="diff against this ref; empty: the revision last reviewed for this spec, else HEAD "
                                                  "when the kernel has uncommitted changes, else the commit before the last one touching it")
    repo_dir: str = Field(default="", description="git checkout holding the family's files (empty: $KREGRESS_REVIEW_REPO, else the "
                                                  "repository the family's source files live in)")
    use_model: bool = Field(default=True, description="ask the model (role review); off: offline checks only")
    compile: bool = Field(default=True, description="AOT-compile the baseline config with the base and the new source")
    max_slice_chars: int = Field(default=DEFAULT_SLICE_CHARS, ge=2000, description="diff characters per model call")
    remember: bool = Field(default=True, description="record the reviewed revision as the next review's base")
    patch_variant: str = Field(default="", description="review the patch `kregress judge` judged under this variant id "
                                                       "(reports/<task_id>/judge/<judgement id>/patches/; the newest judgement, "
                                                       "or <judgement id>/<variant id>) instead of the git diff")


def _findings_table(findings: list[ReviewFinding]) -> dg.TableMetadataValue:
    cols = [("risk", "string"), ("checklist_item", "string"), ("file", "string"), ("line", "string"), ("in_diff", "string"),
            ("evidence", "string"), ("verify_command", "string"), ("source", "string"), ("flag", "string")]
    recs = [dg.TableRecord({"risk": f.risk, "checklist_item": f.checklist_item, "file": f.file, "line": str(f.line or ""),
                            "in_diff": "" if f.in_diff is None else ("yes" if f.in_diff else "NO"), "evidence": f.evidence,
                            "verify_command": f.verify_command, "source": f.source, "flag": f.flag}) for f in findings]
    return dg.MetadataValue.table(records=recs, schema=dg.TableSchema(columns=[dg.TableColumn(n, t) for n, t in cols]))


def build_review_assets() -> list:
    """[kernel_source_review] (partitioned by spec, group "review", resources specs / taotoken / ledger) with its
    check kernel_review_clean (no high-risk finding, no finding outside the diff, the new source compiles)."""

    @dg.asset(
        name=ASSET_NAME,
        partitions_def=SPECS_PARTITIONS,
        group_name=GROUP_REVIEW,
        kinds={"git", "triton", "openai"},
        owners=OWNERS,
        description="Agent review (role review) of the kernel diff that matters to this spec, against its acceptance checklist; "
                    "offline compile-stat deltas and test coverage when no model is available.",
        check_specs=[dg.AssetCheckSpec(CHECK_NAME, asset=ASSET_NAME, partitions_def=SPECS_PARTITIONS,
                                       description="No high-risk finding, no finding citing a line outside the diff, the new source compiles.")],
    )
    def kernel_source_review(context: dg.AssetExecutionContext, config: ReviewConfig, specs: SpecStore,
                             taotoken: TaotokenResource, ledger: LedgerResource):
        spec = specs.load(context.partition_key)  # schema only: the kernel change under review may break the spec
        spec_path = str(spec.source or "")
        gateway, why = None, ""
        if not config.use_model:
            why = "use_model is off"
        else:
            try:
                gw = taotoken.get_gateway(ledger.get_ledger(), log=context.log)
                if gw.has_key("review"):
                    gateway = gw
                else:
                    why = "no TAOTOKEN key for role review (TAOTOKEN_KEY_REVIEW / TAOTOKEN_API_KEY)"
                    gw.close()
            except GatewayError as e:
                why = f"{e.category} error: {str(e)[:300]}"
        try:
            result = run_review(spec, repo_dir=config.repo_dir, base_ref=config.base_ref, gateway=gateway, no_model_reason=why,
                                run_id=context.run_id, partition=context.partition_key, spec_path=spec_path, compile=config.compile,
                                max_slice_chars=config.max_slice_chars, remember=config.remember, log=context.log,
                                patch_variant=config.patch_variant)
        except ReviewError as e:
            raise dg.Failure(description=str(e)) from None
        finally:
            if gateway is not None:
                gateway.close()
        high = [f for f in result.findings if f.risk == "high"]
        outside = [f for f in result.findings if f.in_diff is False]
        broken = result.compile is not None and not result.compile.new.ok
        md = {
            "reviewed_by": dg.MetadataValue.text(result.reviewed_by),
            "model_reviewed": dg.MetadataValue.bool(result.model_reviewed),
            "diff": dg.MetadataValue.text(f"{result.base_ref} ({result.base_sha[:10]}) -> working tree at {result.head_sha[:10]}"),
            "files_reviewed": dg.MetadataValue.text(", ".join(result.files_reviewed) or "none"),
            "files_changed_elsewhere": dg.MetadataValue.text(", ".join(result.files_changed_elsewhere) or "none"),
            "findings": _findings_table(result.findings),
            "n_findings": dg.MetadataValue.int(len(result.findings)),
            "n_high": dg.MetadataValue.int(len(high)),
            "n_outside_diff": dg.MetadataValue.int(len(outside)),
            "compile_deltas": dg.MetadataValue.md(compile_markdown(result.compile)),
            "test_coverage": dg.MetadataValue.md(coverage_markdown(result.coverage)),
            "suggested_commands": dg.MetadataValue.md("\n".join(f"- `{c}` (not run)" for c in result.suggested_commands) or "_none_"),
            "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in result.notes) or "_none_"),
            "report": dg.MetadataValue.path(result.report_path),
            "slices": dg.MetadataValue.int(result.slices),
            "tokens_total": dg.MetadataValue.int(result.tokens.get("total", 0)),
        }
        problems = [f"{len(high)} high-risk finding(s)"] if high else []
        problems += [f"{len(outside)} finding(s) cite a line outside the diff"] if outside else []
        problems += ["the new source does not compile for the baseline config"] if broken else []
        check = dg.AssetCheckResult(
            check_name=CHECK_NAME, passed=not problems, severity=dg.AssetCheckSeverity.WARN,
            description="; ".join(problems) or "clean",
            metadata={"task_id": context.partition_key, "reviewed_by": result.reviewed_by, "n_high": len(high),
                      "n_outside_diff": len(outside), "compiles": not broken},
        )
        return dg.MaterializeResult(value=result.model_dump(mode="json"), metadata=md, check_results=[check])

    return [kernel_source_review]
