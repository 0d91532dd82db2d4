"""`kregress --help` and the built-in commands' --help import no Dagster, torch or Triton (checked in a fresh
subprocess through sys.modules; the time it takes is a benchmark, bench/pipeline.py, not a test)."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_assets.cli import PLUGINS, build_parser, plugin_commands

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("dagster", "torch", "triton")
PROBE = """
import json, sys
from kernel_assets.cli import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print(json.dumps({"code": code, "heavy": sorted(m for m in %r if m in sys.modules)}), file=sys.stderr)
""" % (HEAVY,)


def _probe(*argv: str) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, cwd=REPO, timeout=120)
    return {**json.loads(p.stderr.strip().splitlines()[-1]), "out": p.stdout}


@pytest.mark.parametrize("argv", [("--help",), ("sweep", "--help"), ("review", "--help"), ("specs", "--help"),
                                  ("specs", "validate", "--help"), ("history", "--help"), ("history", "show", "--help"),
                                  ("history", "ack", "--help")])
def test_help_imports_no_heavy_module(argv):
    res = _probe(*argv)
    assert res["code"] == 0, res
    assert res["heavy"] == [], f"`kregress {' '.join(argv)}` imported {res['heavy']}"
    assert "usage: kregress" in res["out"]


def test_top_level_help_lists_every_plugin_command():
    out = _probe("--help")["out"]
    for mod in PLUGINS:
        for name, _ in plugin_commands(mod) or []:
            assert name in out, f"{name} (from {mod}) missing from kregress --help"


def test_plugin_commands_read_from_source_match_their_registration():
    """What --help lists from a plugin's source is what the plugin really registers (names and help)."""
    for mod in PLUGINS:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue
            raise
        sub = argparse.ArgumentParser().add_subparsers()
        module.register(sub)
        real = [(a.dest, a.help) for a in sub._choices_actions]
        listed = plugin_commands(mod)
        assert listed is None or listed == real, f"{mod}: source says {listed}, register() adds {real}"


def test_plugin_command_runs_the_real_parser():
    """A placeholder is never what runs: asking for a plugin's command imports the plugin."""
    for mod in PLUGINS:
        for name, _ in plugin_commands(mod) or []:
            parser = build_parser([name])
            action = next(a for a in parser._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
            assert action.choices[name].add_help, f"{name}: the placeholder parser was used"
