"""docs/spec-reference.md is generated from the spec's pydantic models and must be current."""

from __future__ import annotations

from pathlib import Path

from kregress.core import spec_reference

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "spec-reference.md"


def test_the_spec_reference_is_current():
    want = spec_reference.render()
    have = DOC.read_text() if DOC.is_file() else ""
    assert have == want, f"docs/spec-reference.md is not current: run `{spec_reference.COMMAND}` and commit it"


def test_every_field_is_described():
    """A field added to kregress/core/spec.py needs a `description=` in its model (or a line in NOTES)."""
    bare = [key for _, model, prefix in spec_reference._sections()
            for key, *_, what in spec_reference._rows(model, prefix) if not what]
    assert not bare, f"spec fields without a description: {bare} (add description= in kregress/core/spec.py)"


def test_every_section_and_bound_is_in_the_reference():
    text = spec_reference.render()
    for title, model, prefix in spec_reference._sections():
        assert f"## {title}" in text
        for name in model.model_fields:
            assert f"`{prefix}{name}`" in text
    assert "| `search.max_rounds` | int | `3` | >= 1, <= 4 |" in text  # bounds come from the model
    assert "one of `local`, `llm`, `hybrid`" in text  # Literal values listed
    assert "`benchmark.max_batch_rounds` | int or null | null | >= 1, <= 1,000, at least `batch_rounds`" in text
