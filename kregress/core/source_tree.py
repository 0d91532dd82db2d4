"""One parse per source text: the syntax trees every reader of a kernel file shares.

A judgement reads each editable file through several readers (its regions, the fixed skeleton, the static
policy's facts, the compiled parts that key the caches); each asks ``parse_source`` and gets the one tree
parsed for that text in this process. The trees are shared, so a reader never changes one (build a new
node instead). ``SyntaxError`` is raised, not cached, as ``ast.parse`` raises it."""

from __future__ import annotations

import ast
from functools import lru_cache


@lru_cache(maxsize=128)
def parse_source(text: str) -> ast.Module:
    """The syntax tree of ``text``, parsed once per distinct text; read-only for every caller."""
    return ast.parse(text)
