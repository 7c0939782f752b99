"""The documentation pages stay consistent with the tree: the README's Layout names every module
there is (and nothing that is not), and links between the pages land on existing headings."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYOUT_DIRS = ("oir_gym", "agents", "examples", "bench")


def _layout() -> str:
    readme = (ROOT / "README.md").read_text()
    return re.search(r"^## Layout\n\n```\n(.*?)^```", readme, re.S | re.M).group(1)


def test_readme_layout_names_every_module_and_only_existing_ones():
    layout = _layout()
    packages = [ROOT / d for d in LAYOUT_DIRS] + [p for p in (ROOT / "agents").iterdir() if (p / "__init__.py").is_file()]
    files = {p.name for d in packages for p in d.iterdir() if p.suffix in (".py", ".sh") and p.name != "__init__.py"}
    subdirs = {f"{p.name}/" for d in ("oir_gym", "agents") for p in (ROOT / d).iterdir()
               if p.is_dir() and not p.name.startswith("__")}
    named = set(re.findall(r"\b[\w]+\.(?:py|sh)\b", layout))
    assert not files - named, f"README Layout misses {sorted(files - named)}"
    assert not named - files, f"README Layout names files that do not exist: {sorted(named - files)}"
    for d in subdirs | {f"{d}/" for d in LAYOUT_DIRS}:
        assert re.search(rf"(^|\s){re.escape(d)}", layout), f"README Layout misses {d}"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_pages_land_on_existing_headings():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    anchors = {p.name: {_slug(line.lstrip("#")) for line in p.read_text().splitlines() if line.startswith("#")}
               for p in pages}
    broken = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([\w./]*?\.md|)#([\w\-]+)\)", page.read_text()):
            name = Path(target).name if target else page.name
            if name in anchors and anchor not in anchors[name]:
                broken.append(f"{page.name} -> {target or page.name}#{anchor}")
    assert not broken, broken
