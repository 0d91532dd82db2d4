"""The gateway from the coding tools: export, lint and diagnose Claude Code, Codex and CC Switch set-ups.

Not part of the asset graph: no Dagster, no Triton, no torch, and nothing from ``resources`` or
``kernel_assets``. URL and key rules come from :mod:`kregress.core.endpoints` (the gateway uses the same
ones); network calls go through the openai SDK.

- :mod:`kernel_assets.clients.common`: key and secret helpers shared by the three tools.
- :mod:`kernel_assets.clients.export`: ``kregress export-config`` (Claude Code settings.json, Codex config.toml).
- :mod:`kernel_assets.clients.ccswitch`: CC Switch 3.x ``.sql`` (its import dialog, or merged with sqlite3),
  its ``ccswitch://`` deeplink, and the pre-3.0 ``config.json`` (v2) shape.
- :mod:`kernel_assets.clients.lint`: ``kregress lint-config``.
- :mod:`kernel_assets.clients.doctor`: ``kregress doctor [--ping] [--tool X]``; exit codes in its docstring.
- :mod:`kernel_assets.clients.cli`: the subcommands (``register(sub)`` for ``kernel_assets.cli.PLUGINS``).
"""
