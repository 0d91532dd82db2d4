"""One home: the ledger, the compile cache, the reports and the history of a sweep land in the same
DAGSTER_HOME whatever the current directory (kregress.core.paths.home() is the only resolver)."""

from __future__ import annotations

from pathlib import Path

from kregress.core import paths

REPO = Path(__file__).resolve().parent.parent


def _resolvers() -> dict[str, Path]:
    from kernel_assets.history import history_root
    from resources.gpu import InterpreterBackend, ReplayBackend
    from resources.ledger import LedgerResource, default_ledger_path

    return {
        "paths.home": paths.home(),
        "ledger": default_ledger_path().parent,
        "ledger resource": Path(LedgerResource().get_ledger().path).parent,
        "interpreter cache": InterpreterBackend().cache_root().parent,
        "replay cache": ReplayBackend().cache_root().parent,
        "history": history_root().parent,
        "reports": paths.reports_dir().parent,
        "review": paths.review_dir().parent,
    }


def test_every_resolver_agrees_whatever_the_cwd(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    for cwd in (tmp_path, REPO, REPO / "tests"):
        monkeypatch.chdir(cwd)
        got = _resolvers()
        assert set(got.values()) == {home.resolve()}, got


def test_without_dagster_home_it_is_the_projects_folder_not_the_cwd(tmp_path, monkeypatch):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    got = _resolvers()
    assert set(got.values()) == {REPO / "dagster_home"}, got


def test_a_sweep_writes_everything_under_one_home(dagster_home, tmp_path, monkeypatch):
    from kernel_assets.cli import main

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["sweep", str(REPO / "specs" / "replay_clblast_rtx3090.yaml")]) == 0
    home = dagster_home.resolve()
    assert (home / "ledger.sqlite").is_file()
    assert (home / "reports" / "replay_clblast_rtx3090" / "report.md").is_file()
    assert any((home / "kregress_history").rglob("*.parquet"))
    assert list(elsewhere.iterdir()) == []  # nothing landed in the current directory
