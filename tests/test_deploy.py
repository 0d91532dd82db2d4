"""deploy/: the PostgreSQL instance config and the Kubernetes executor setup.

The instance config is validated by Dagster's own loader (``dagster_instance_config``, the code that
reads ``$DAGSTER_HOME/dagster.yaml``); its Postgres schema ships with dagster itself, so no Postgres
server or dagster-postgres is needed. The Kubernetes files are validated structurally, and against
dagster-k8s's own schemas where dagster-k8s is installed (the ``deploy`` extra).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from dagster import (
    DagsterInstance,
    Definitions,
    asset,
    in_process_executor,
    materialize,
    multiprocess_executor,
)
from dagster._config import Shape, process_config
from dagster._core.errors import DagsterInvalidConfigError
from dagster._core.instance.config import (
    ConcurrencyConfig,
    PoolGranularity,
    dagster_instance_config,
    dagster_instance_config_schema,
)
from dagster._core.instance.ref import InstanceRef

from kernel_assets import executors
from kernel_assets.executors import (
    benchmark_op_tags,
    executor_from_env,
    k8s_executor_config,
)
from kregress.core.names import GPU_POOL

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
PG_ENV = ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB")

# dagster-k8s 0.29: fields of k8s_job_executor's config and of a dagster-k8s/config value
K8S_EXECUTOR_FIELDS = {
    "job_image", "image_pull_policy", "image_pull_secrets", "service_account_name", "env_config_maps",
    "env_secrets", "env_vars", "volume_mounts", "volumes", "labels", "resources", "scheduler_name",
    "security_context", "load_incluster_config", "kubeconfig_file", "job_namespace", "retries",
    "max_concurrent", "tag_concurrency_limits", "step_k8s_config", "per_step_k8s_config",
    "enable_owner_references", "step_dependency_config",
}  # fmt: skip
K8S_CONFIG_FIELDS = {
    "container_config", "pod_template_spec_metadata", "pod_spec_config", "job_config", "job_metadata",
    "job_spec_config", "merge_behavior",
}  # fmt: skip


def raw_instance_yaml() -> dict:
    return yaml.safe_load((DEPLOY / "dagster.yaml").read_text())


def has_dagster_k8s() -> bool:
    try:
        import dagster_k8s  # noqa: F401
    except ImportError:
        return False
    return True


# --- dagster.yaml -------------------------------------------------------------------------------------


STORAGE = ("kernel_assets.pool_storage_postgres", "PoolSafePostgresStorage")


def _storage_config(raw: dict):
    """The custom storage's config processed by its class's own schema (storage: postgres:'s)."""
    from kernel_assets.pool_storage_postgres import PoolSafePostgresStorage

    return process_config(Shape(PoolSafePostgresStorage.config_type()), raw["storage"]["custom"]["config"])


def test_instance_yaml_passes_dagsters_own_validation():
    config, custom_class = dagster_instance_config(str(DEPLOY))
    assert custom_class is None
    storage = config["storage"]["custom"]
    assert (storage["module"], storage["class"]) == STORAGE
    db = storage["config"]["postgres_db"]
    assert {k: db[k] for k in ("hostname", "port", "username", "password", "db_name")} == {
        "hostname": {"env": "DAGSTER_PG_HOST"},
        "port": {"env": "DAGSTER_PG_PORT"},
        "username": {"env": "DAGSTER_PG_USER"},
        "password": {"env": "DAGSTER_PG_PASSWORD"},
        "db_name": {"env": "DAGSTER_PG_DB"},
    }
    assert db["scheme"] == "postgresql+psycopg2"


def test_scheme_names_the_driver_dagster_postgres_installs():
    """SQLAlchemy 2.1 maps a bare postgresql:// to psycopg 3, which dagster-postgres does not install."""
    from sqlalchemy.engine import make_url

    config, _ = dagster_instance_config(str(DEPLOY))
    scheme = config["storage"]["custom"]["config"]["postgres_db"]["scheme"]
    assert make_url(f"{scheme}://u:p@h:5432/db").get_dialect().driver == "psycopg2"


def test_instance_ref_uses_postgres_storage_and_the_run_queue(tmp_path):
    ref = InstanceRef.from_dir(str(tmp_path), config_dir=str(DEPLOY))
    assert (ref.storage_data.module_name, ref.storage_data.class_name) == STORAGE
    assert ref.run_coordinator_data.class_name == "QueuedRunCoordinator"
    assert not list(DEPLOY.glob("storage*")) and not list(DEPLOY.glob("history*"))  # nothing written there


def test_postgres_settings_come_from_the_environment(monkeypatch):
    env = dict(zip(PG_ENV, ("pg.internal", "6543", "dagster", "s3cret", "kregress")))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = process_config(Shape(dagster_instance_config_schema()), raw_instance_yaml())
    assert result.success, result.errors
    result = _storage_config(raw_instance_yaml())
    assert result.success, result.errors
    db = result.value["postgres_db"]
    assert (db["hostname"], db["port"], db["username"], db["password"], db["db_name"]) == (
        "pg.internal", 6543, "dagster", "s3cret", "kregress",
    )  # fmt: skip


def test_missing_postgres_variable_is_named(monkeypatch):
    for k in PG_ENV:
        monkeypatch.setenv(k, "5432" if k.endswith("PORT") else "x")
    monkeypatch.delenv("DAGSTER_PG_PASSWORD")
    result = _storage_config(raw_instance_yaml())
    assert not result.success
    assert "DAGSTER_PG_PASSWORD" in " ".join(e.message for e in result.errors)


def test_run_queue_and_gpu_pool_settings():
    config, _ = dagster_instance_config(str(DEPLOY))
    conc = ConcurrencyConfig.from_concurrency_settings(config["concurrency"], None)
    assert conc.pool_config.pool_granularity == PoolGranularity.OP
    assert conc.pool_config.default_pool_limit == 1
    assert config["concurrency"]["runs"]["max_concurrent_runs"] >= 1
    assert config["run_queue"]["max_user_code_failure_retries"] >= 0


def test_gpu_pool_gets_one_slot_on_an_instance_with_these_settings(tmp_path):
    """The deploy settings on a SQLite instance: a benchmark step in the `gpu` pool runs, and the pool
    is created with a limit of 1 (what Postgres would hold too)."""
    cfg = raw_instance_yaml()
    cfg["storage"] = {"sqlite": {"base_dir": str(tmp_path / "storage")}}
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    instance = DagsterInstance.from_config(str(tmp_path))
    try:
        pools = instance.get_concurrency_config().pool_config
        assert pools.pool_granularity == PoolGranularity.OP and pools.default_pool_limit == 1

        @asset(pool=GPU_POOL, op_tags=benchmark_op_tags())
        def bench_step() -> int:
            return 1

        result = materialize([bench_step], instance=instance)
        assert result.success
        assert instance.event_log_storage.get_concurrency_info(GPU_POOL).slot_count == 1
    finally:
        instance.dispose()


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda c: c["run_queue"].update(max_concurrent_runs=3), "incompatible with the `concurrency > runs`"),
        (lambda c: c["concurrency"]["pools"].update(granularity="step"), "granularity"),
        (lambda c: c.update(storge={}), "storge"),
    ],
)
def test_dagsters_validation_is_not_vacuous(tmp_path, mutate, match):
    cfg = raw_instance_yaml()
    mutate(cfg)
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(DagsterInvalidConfigError) as err:
        dagster_instance_config(str(tmp_path))
    text = str(err.value) + " ".join(e.message for e in getattr(err.value, "errors", []))
    assert match in text


def test_a_wrong_storage_field_is_named_when_the_instance_loads(tmp_path, monkeypatch):
    """The custom storage's config is checked by its class when an instance opens (before any connection)."""
    for k in PG_ENV:
        monkeypatch.setenv(k, "5432" if k.endswith("PORT") else "x")
    cfg = raw_instance_yaml()
    cfg["storage"]["custom"]["config"]["postgres_db"]["hostnme"] = "x"
    assert not _storage_config(cfg).success
    (tmp_path / "dagster.yaml").write_text(yaml.safe_dump(cfg))
    with pytest.raises(DagsterInvalidConfigError) as err:
        DagsterInstance.from_config(str(tmp_path)).get_runs(limit=1)
    assert "hostnme" in str(err.value) + " ".join(e.message for e in getattr(err.value, "errors", []))


def test_readme_names_every_variable_the_config_reads():
    readme = (DEPLOY / "README.md").read_text()
    used = set(re.findall(r"env:\s*\n?\s*(\w+)", (DEPLOY / "dagster.yaml").read_text()))
    assert used == set(PG_ENV)
    missing = [v for v in sorted(used) if v not in readme]
    assert not missing, f"deploy/README.md does not mention {missing}"
    assert "KREGRESS_EXECUTOR" in readme and "dagster instance concurrency set gpu" in readme


# --- Kubernetes ---------------------------------------------------------------------------------------


def test_k8s_executor_yaml_structure():
    cfg = k8s_executor_config()
    assert set(cfg) <= K8S_EXECUTOR_FIELDS, set(cfg) - K8S_EXECUTOR_FIELDS
    assert isinstance(cfg["max_concurrent"], int) and cfg["max_concurrent"] >= 1
    assert list(cfg["retries"]) in (["enabled"], ["disabled"])
    assert set(cfg["step_k8s_config"]) <= K8S_CONFIG_FIELDS
    assert "nvidia.com/gpu" not in json.dumps(cfg), "only benchmark steps ask for a GPU"
    assert "job_image" not in cfg  # the code location's image


def test_gpu_step_tags_request_one_gpu():
    tags = benchmark_op_tags()
    assert list(tags) == ["dagster-k8s/config"]
    k8s = tags["dagster-k8s/config"]
    assert set(k8s) <= K8S_CONFIG_FIELDS
    resources = k8s["container_config"]["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources.get("requests", {}).get("nvidia.com/gpu", 1) == 1  # requests, if given, equal limits
    toleration = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert toleration in k8s["pod_spec_config"]["tolerations"]
    json.dumps(tags)  # tags travel as JSON
    # a fresh copy each call: a caller cannot change the next asset's tags
    tags["dagster-k8s/config"]["container_config"] = {}
    assert benchmark_op_tags()["dagster-k8s/config"]["container_config"]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_benchmark_asset_carries_pool_and_tags():
    @asset(pool=GPU_POOL, op_tags=benchmark_op_tags())
    def round_1_variants() -> int:
        return 1

    node = round_1_variants.node_def
    assert node.pool == "gpu"
    assert isinstance(node.tags["dagster-k8s/config"], str)  # Dagster stores the tag as JSON, as dagster-k8s reads it
    assert json.loads(node.tags["dagster-k8s/config"])["container_config"]["resources"]["limits"] == {
        "memory": "32Gi",
        "nvidia.com/gpu": 1,
    }
    Definitions(assets=[round_1_variants], executor=executor_from_env({"KREGRESS_EXECUTOR": "in_process"}))


def test_executor_from_env():
    assert executor_from_env({}) is in_process_executor  # a launched run: one process, as the CLI
    assert executor_from_env({"KREGRESS_EXECUTOR": "multiprocess"}) is multiprocess_executor
    assert executor_from_env({"KREGRESS_EXECUTOR": " in_process "}) is in_process_executor
    with pytest.raises(ValueError, match="allowed: multiprocess, in_process, k8s"):
        executor_from_env({"KREGRESS_EXECUTOR": "celery"})


@pytest.mark.skipif(has_dagster_k8s(), reason="dagster-k8s is installed")
def test_k8s_executor_without_dagster_k8s_says_what_to_install():
    with pytest.raises(ImportError, match="deploy"):
        executor_from_env({"KREGRESS_EXECUTOR": "k8s"})


@pytest.mark.skipif(not has_dagster_k8s(), reason="needs dagster-k8s (the deploy extra)")
def test_k8s_files_pass_dagster_k8s_schemas():
    from dagster._config import validate_config
    from dagster_k8s import k8s_job_executor
    from dagster_k8s.job import get_user_defined_k8s_config

    result = validate_config(k8s_job_executor.config_schema.config_type, k8s_executor_config())
    assert result.success, result.errors
    executor = executor_from_env({"KREGRESS_EXECUTOR": "k8s"})
    assert executor.name == "k8s"
    tags = {k: json.dumps(v) for k, v in benchmark_op_tags().items()}
    user = get_user_defined_k8s_config(tags)
    assert user.container_config["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_module_paths_exist():
    for p in (executors.INSTANCE_YAML, executors.K8S_EXECUTOR_YAML, executors.GPU_STEP_TAGS_YAML):
        assert p.is_file(), p
    assert copy.deepcopy(k8s_executor_config()) == k8s_executor_config()
