"""The docs as a reader follows them: links between pages land on a heading that exists,
and no page says the kubelet stand-in is what `unwind dev up` runs (it runs a real kubelet
with containerd; the stand-in is for a few fast tests)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _prose(page: Path) -> str:
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # headings in code are not headings


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_heading_of_a_docs_page_lands_on_a_heading_that_exists() -> None:
    headings = {p.name: {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", _prose(p), re.M)}
                for p in PAGES}
    broken = []
    for page in PAGES:
        for m in re.finditer(r"\]\(([\w./-]*\.md)?#([^)\s]+)\)", _prose(page)):
            target = Path(m.group(1)).name if m.group(1) else page.name
            if target in headings and m.group(2) not in headings[target]:
                broken.append(f"{page.name}: {m.group(0)}")
    assert broken == []


def test_no_page_says_dev_up_runs_the_kubelet_stand_in_or_the_operator_as_a_process() -> None:
    said = []
    for page in PAGES:
        for part in re.split(r"\n\s*\n|\n\|", _prose(page)):  # paragraphs and table rows
            flat = " ".join(part.split())
            if "dev up" in flat and ("stand-in" in flat or "as a local process" in flat) \
                    and "real kubelet" not in flat:
                said.append(f"{page.name}: {flat[:160]}")
    assert said == []
