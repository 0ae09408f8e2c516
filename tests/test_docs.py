"""The docs site builds with `mkdocs build --strict` (no broken link or anchor, no page outside the nav)
and its nav lists every page under docs/. Fast: a build of the site takes a few seconds."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")


def _nav_pages(entries) -> list[str]:
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return pages


def _mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    if not MKDOCS.exists():
        pytest.skip(f"{MKDOCS} is missing: install the docs extra (scripts/setup docs)")
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its successor, on every build


def _copy_site_sources(dest: Path) -> Path:
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    return dest / "mkdocs.yml"


def test_nav_lists_every_page_under_docs():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, f"in the nav only: {sorted(set(nav) - set(pages))}; " \
                                 f"under docs/ only: {sorted(set(pages) - set(nav))}"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"


def test_site_builds_strict_and_offline(tmp_path):
    result = _mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "how-to" / "scaling-out" / "index.html").exists()
    html = (tmp_path / "site" / "index.html").read_text()
    # theme.font: false: the pages ask no font server, so the site reads the same offline
    assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: the same sources with one link to a page that does not exist."""
    config = _copy_site_sources(tmp_path / "src")
    index = tmp_path / "src" / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
    result = _mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr
