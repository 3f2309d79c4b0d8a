"""The documentation in step: the configuration reference is what the declarations say, and every
relative link and ``#anchor`` of README.md and docs/*.md leads somewhere.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import config_reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_configuration_reference_is_the_generators_output() -> None:
    assert config_reference.DOC.read_text() == config_reference.render(), (
        "docs/configuration.md is stale: run "
        "`uv run python scripts/config_reference.py > docs/configuration.md`"
    )


def test_the_generators_check_says_so_from_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "config_reference.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert (done.returncode, done.stderr) == (0, "")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings, and its explicit ``id``s."""
    text = _FENCE.sub("", page.read_text())
    found = set(re.findall(r'<a id="([^"]+)"', text))
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug)
    return found


def links() -> list[tuple[Path, str]]:
    return [
        (page, target)
        for page in PAGES
        for target in _LINK.findall(_FENCE.sub("", page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


@pytest.mark.parametrize(
    ("page", "target"), links(), ids=lambda value: getattr(value, "name", value)
)
def test_every_relative_link_and_anchor_resolves(page: Path, target: str) -> None:
    path, _, anchor = target.partition("#")
    linked = (page.parent / path).resolve() if path else page
    assert linked.exists(), f"{page.name}: {target}: no such file"
    if anchor:
        assert linked.suffix == ".md", f"{page.name}: {target}: an anchor into a non-page"
        assert anchor in anchors(linked), f"{page.name}: {target}: no such heading"


def test_the_docs_are_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, page.name
