"""The docs hold together: every relative link resolves inside the repository (to a file, and to a
heading where it names one), the README stays short and links every page of docs/, and no link
leaves the repository except to an upstream project. No engine, no network.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS, ROOT / "deploy" / "README.md", ROOT / "bench" / "README.md"]
README_MAX_LINES = 250
# Hosts a page may link to: the projects this one builds on, never a copy of our own docs elsewhere.
UPSTREAM_HOSTS = {"github.com", "docs.vllm.ai", "llm-d.ai", "kustomize.io", "prometheus.io", "opentelemetry.io"}

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
_EXPLICIT_ID = re.compile(r"\s*\{#([^}\s]+)\}\s*$")


def _prose(text: str) -> str:
    """The text links can live in: fenced blocks and code spans removed."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.lower().replace("`", "")
    text = "".join(ch for ch in text if ch.isalnum() or ch in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text())):
        explicit = _EXPLICIT_ID.search(heading)
        if explicit:  # `## Title {#id}`: the id this project's pages and tests name
            found.add(explicit.group(1))
            heading = heading[: explicit.start()]
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")  # GitHub numbers repeated headings
    found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", path.read_text()))
    return found


def links(path: Path) -> list[str]:
    return _LINK.findall(_prose(path.read_text()))


def _relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_to_a_file_and_heading_in_the_repository(page: Path):
    broken = []
    for target in filter(_relative, links(page)):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(file_part)).resolve() if file_part else page
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_link_leaves_the_repository_except_to_an_upstream_project(page: Path):
    foreign = [t for t in links(page) if not _relative(t) and urlparse(t).hostname not in UPSTREAM_HOSTS]
    assert not foreign, f"{page.relative_to(ROOT)} links outside: {foreign}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_names_a_path_outside_the_repository(page: Path):
    """A clone has only the repository: no sibling checkout, no machine's own paths."""
    text = page.read_text()
    found = [p for p in ("../shared", "DESIGN.md", "/work/") if p in text]
    assert not found, f"{page.relative_to(ROOT)} names {found}"


def test_the_readme_is_short_and_links_every_docs_page():
    text = README.read_text()
    assert text.count("\n") <= README_MAX_LINES, f"README.md: {text.count(chr(10))} lines (at most {README_MAX_LINES})"
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in filter(_relative, links(README))}
    unlinked = [p.name for p in DOCS if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


def test_anchors_follow_githubs_rules():
    assert _slug("vLLM versions: supported lines and upgrading") == "vllm-versions-supported-lines-and-upgrading"
    assert _slug("Scale-out (`--api-server-count N`)") == "scale-out---api-server-count-n"
    assert _slug("The prefill lease, 30 s") == "the-prefill-lease-30-s"
