"""The docs agree with the code: docs/configuration.md lists every engine setting with the defaults that the code
and the shipped config.pbtxt give; the README stays short; relative links in the docs resolve."""

import dataclasses
import re
from pathlib import Path

import pytest

from specgram.config import EngineConfig

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "deploy" / "README.md"]


def _config_rows(text: str) -> dict[str, tuple[str, str]]:
    """`| key | served | engine | meaning |` rows -> {key: (served, engine)}, backticks stripped."""
    rows = {}
    for m in re.finditer(r"^\| `(\w+)` \| ([^|]+) \| ([^|]+) \|", text, re.M):
        rows[m.group(1)] = (m.group(2).strip().strip("`"), m.group(3).strip().strip("`"))
    return rows


def _pbtxt_parameters() -> dict[str, str]:
    text = (REPO / "model_repository" / "llm" / "config.pbtxt").read_text()
    return dict(re.findall(r'parameters \{ key: "(\w+)", value: \{ string_value: "([^"]*)" \} \}', text))


def _spelled(value) -> str:
    """A default as the table writes it."""
    if value is dataclasses.MISSING:
        return "required"
    if isinstance(value, bool):
        return str(int(value))
    return '""' if value == "" else str(value)


def test_configuration_doc_lists_every_setting_with_its_defaults():
    rows = _config_rows((REPO / "docs" / "configuration.md").read_text(encoding="utf-8"))
    fields = {f.name: f.default for f in dataclasses.fields(EngineConfig)}
    assert set(rows) == set(fields), f"missing: {set(fields) - set(rows)}, unknown: {set(rows) - set(fields)}"
    served = _pbtxt_parameters()
    assert set(served) <= set(fields)
    for key, (doc_served, doc_engine) in rows.items():
        assert doc_engine == _spelled(fields[key]), f"{key}: engine default {doc_engine!r} vs {fields[key]!r}"
        expected = _spelled(served[key]) if key in served else "–"
        assert doc_served == expected, f"{key}: served default {doc_served!r}, config.pbtxt {expected!r}"


def test_config_row_parser_sees_a_wrong_default():
    text = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    broken = text.replace("| `max_slots` | `8` | `8` |", "| `max_slots` | `8` | `16` |")
    assert broken != text
    assert _config_rows(broken)["max_slots"] == ("8", "16")


def test_readme_is_short():
    assert len((REPO / "README.md").read_bytes()) <= 12_000


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"\w+://", target) or target.startswith("mailto:"):
            continue
        path, _, anchor = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        assert dest.exists(), f"{doc.name}: link to {target} (no such file)"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest.read_text(encoding="utf-8")), f"{doc.name}: no heading #{anchor} in {path}"
