"""What the UI draws, in headless Chromium (issue 55): a replay partition's checks that could not run read
"Skipped", never "Failed", and no partition of the sweep reads Failed; the verdict table is on the report's page.

A replay sweep from the CLI on a temp DAGSTER_HOME, then a real `dagster dev` on it, and Chromium's rendered DOM
(``--dump-dom``) read as text. Screenshots go to the test's temp folder; with KREGRESS_UPDATE_SCREENSHOTS=1 they
are also copied to docs/screenshots/ (not_checked_skipped.png, verdict_table.png).

Chromium: Debian's ``chromium`` package (``apt-get install -y chromium``); skipped without it.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "specs" / "replay_clblast_rtx3090.yaml"
TASK = "replay_clblast_rtx3090"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = REPO / "docs" / "screenshots"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chromium(args: list[str], profile: Path, timeout_s: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                           "--window-size=1440,1000", "--virtual-time-budget=30000", *args],
                          capture_output=True, text=True, timeout=timeout_s)


def _text(dom: str) -> str:
    dom = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", dom)).split())


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("needs Chromium (Debian: apt-get install -y chromium)")
    root = tmp_path_factory.mktemp("ui")
    home = root / "home"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KREGRESS_")}, "DAGSTER_HOME": str(home),
           "KREGRESS_REPLAY_DIR": str(root / "replay")}
    p = subprocess.run([sys.executable, "-m", "kernel_assets.cli", "sweep", str(SPEC), "--dagster-home", str(home)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    (home / ".nux").mkdir(exist_ok=True)  # Dagster's "join the community" dialog was seen: it would cover the page
    (home / ".nux" / "nux.yaml").write_text("seen: 1\n")
    port = _free_port()
    log = open(root / "dagster_dev.log", "w")
    dev = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "dev", "-w", "workspace.yaml", "-p", str(port)],
                           cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert dev.poll() is None, (root / "dagster_dev.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "dagster dev did not serve within 600 s"
            time.sleep(2)
        yield f"http://127.0.0.1:{port}", root
    finally:
        if dev.poll() is None:
            dev.terminate()
            try:
                dev.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(dev.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        dev.wait()
        log.close()


def _page(ui, path: str, want: str, name: str) -> str:
    """The page's rendered text once it shows ``want`` (the code location may still be loading), and its
    screenshot as ``name``."""
    base, root = ui
    deadline = time.monotonic() + 300
    while True:
        text = _text(_chromium(["--dump-dom", f"{base}/{path}"], root / "profile").stdout)
        if want in text or time.monotonic() > deadline:
            break
        time.sleep(5)
    shot = root / f"{name}.png"
    _chromium([f"--screenshot={shot}", f"{base}/{path}"], root / "profile")
    assert shot.is_file() and shot.stat().st_size > 10_000
    if os.environ.get("KREGRESS_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, SHOTS / shot.name)
    return text


def test_not_checked_reads_skipped_in_the_ui(ui):
    text = _page(ui, f"assets/baseline_metrics?view=checks&partition={TASK}", "Evaluation result", "not_checked_skipped")
    checks = text.split("Checks (2)", 1)[1].split("Overview", 1)[0]
    assert re.search(r"baseline_constraints( baseline_constraints)? Skipped", checks), checks
    assert re.search(r"baseline_correct( baseline_correct)? Skipped", checks), checks
    assert "Failed" not in checks
    assert "Evaluation result Skipped" in text


def test_the_verdict_table_shows_and_no_partition_reads_failed(ui):
    text = _page(ui, f"assets/verdict_report?view=partitions&partition={TASK}", "verdicts", "verdict_table")
    assert "Failed (0)" in text and "Materialized (1)" in text
    assert "verdicts" in text and "PASS" in text and "REGRESS" in text
