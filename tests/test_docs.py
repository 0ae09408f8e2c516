"""The docs site builds with `mkdocs build --strict` (no broken link or anchor, no page outside the nav)
and its nav lists every page under docs/; the built pages read as written (no stray escapes), the API
reference shows every public name with its parameters, and search finds a spec key by its last part.
Fast: a build of the site takes a few seconds."""

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MKDOCS = Path(sys.executable).with_name("mkdocs")


class _ConfigLoader(yaml.SafeLoader):
    """mkdocs.yml as data: MkDocs' own tags (`!relative`) read as plain strings."""


_ConfigLoader.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node))


def _config() -> dict:
    return yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_ConfigLoader)


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
        capture_output=True, text=True, timeout=300, cwd=config.parent,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its successor, on every build


def _copy_site_sources(dest: Path) -> Path:
    shutil.copytree(ROOT / "docs", dest / "docs")
    shutil.copy(ROOT / "mkdocs.yml", dest / "mkdocs.yml")
    (dest / "experiments").mkdir()
    shutil.copy(ROOT / "experiments" / "README.md", dest / "experiments" / "README.md")  # (included by a page)
    return dest / "mkdocs.yml"


def test_nav_lists_every_page_under_docs():
    nav = _nav_pages(_config()["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages, f"in the nav only: {sorted(set(nav) - set(pages))}; " \
                                 f"under docs/ only: {sorted(set(pages) - set(nav))}"
    assert len(nav) == len(set(nav)), "a page is listed twice in the nav"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site as `scripts/docs build` writes it."""
    out = tmp_path_factory.mktemp("site") / "site"
    result = _mkdocs_build(ROOT / "mkdocs.yml", out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_site_builds_strict_and_offline(site):
    assert (site / "how-to" / "scaling-out" / "index.html").exists()
    html = (site / "index.html").read_text()
    # theme.font: false: the pages ask no font server, so the site reads the same offline
    assert "fonts.googleapis.com" not in html and "fonts.gstatic.com" not in html


def _text_of(page: Path) -> str:
    """A built page's text as a reader sees it (tags dropped, entities decoded)."""
    body = re.sub(r"<script.*?</script>|<style.*?</style>", "", page.read_text(), flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", "", body))


def test_no_page_shows_a_backslash_escape(site):
    """A `\\|` inside backticks in a Markdown table is shown as written, backslash and all (Python-Markdown
    splits cells on the bar first): such a cell must be written as HTML code with `&#124;`."""
    shown = {p.relative_to(site).as_posix(): _text_of(p) for p in site.rglob("*.html")}
    bad = {page: re.findall(r".{0,40}\\\|.{0,20}", text) for page, text in shown.items() if "\\|" in text}
    assert not bad, bad
    assert "NAME|SPEC study name, or its spec file" in " ".join(shown["reference/cli/index.html"].split())


def test_the_api_reference_shows_every_public_name_with_its_parameters(site):
    """The page mkdocstrings renders from the docstrings: every name `hpolab` exports, each function's
    and public method's parameters, and the docstring's first line."""
    import inspect

    import hpolab

    text = " ".join(_text_of(site / "reference" / "python-api" / "index.html").split())
    for name in hpolab._API:
        obj = getattr(hpolab, name)
        assert name in text, f"{name} is not on the API reference page"
        doc = inspect.getdoc(obj)
        assert doc and " ".join(doc.splitlines()[0].replace("`", "").split()) in text, f"{name}: its docstring is not on the page"
        members = [obj] + ([m for n, m in vars(obj).items() if not n.startswith("_") and callable(m)] if inspect.isclass(obj) else [])
        for m in members:
            for p in inspect.signature(m).parameters:
                if p not in ("self", "cls"):
                    assert p in text, f"{name}: parameter {p} of {getattr(m, '__name__', m)} is not on the page"


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check above can fail: the same sources with one link to a page that does not exist."""
    config = _copy_site_sources(tmp_path / "src")
    index = tmp_path / "src" / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[gone](no-such-page.md)\n")
    result = _mkdocs_build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr


# docs/img/ files no screenshot script makes, and the command that does (a benchmark's plot)
PLOTS = {"multifidelity.png": "bench/multifidelity.py --plot docs/img/multifidelity.png",
         "noise.png": "bench/noise.py --studies 8 --json bench/results/noise.json --plot docs/img/noise.png"}


def test_every_image_is_used_and_made_by_one_command():
    """Each picture the pages show is in docs/img/, each file there is shown, and each is remade by
    scripts/docs_images.py (`scripts/docs images`, from the demo study) or, for a benchmark's plot, by
    the command benchmarks.md gives."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_images

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    shown = {Path(m).name for p in pages for m in re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", p.read_text())}
    files = {p.name for p in (ROOT / "docs" / "img").glob("*")}
    assert shown == files, f"shown but missing: {sorted(shown - files)}; in docs/img but shown nowhere: {sorted(files - shown)}"
    assert files == set(docs_images.IMAGES) | set(PLOTS), f"made by no command: {sorted(files - set(docs_images.IMAGES) - set(PLOTS))}"
    bench = (ROOT / "docs" / "benchmarks.md").read_text()
    for command in PLOTS.values():
        assert command in bench, f"benchmarks.md does not give the command that makes the plot: {command}"


def test_the_home_page_links_every_page():
    """docs/index.md's "Where to go" names every page of the nav (a new how-to is found from the home page)."""
    index = (ROOT / "docs" / "index.md").read_text()
    linked = {target.split("#")[0] for target in re.findall(r"\]\(([^)]+\.md[^)]*)\)", index)}
    missing = sorted(set(_nav_pages(_config()["nav"])) - linked - {"index.md"})
    assert not missing, f"docs/index.md links no {missing}"


BENCH_HELPERS = {"baseline_loop.py", "gpu.py", "scale_team.py", "team_stores.py"}  # run by the scripts the page names


def _benchmark_sections() -> dict[str, str]:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    return {s.split("\n", 1)[0]: s for s in re.split(r"^## ", page, flags=re.M)[1:]}


def test_benchmarks_give_a_method_one_command_and_a_dated_result_with_its_load():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", page), "a commit hash in benchmarks.md"
    for note in ("UTC", "before this change", "another engineer", "other people", "this commit"):
        assert note not in page, f"a lab note in benchmarks.md: {note!r}"
    sections = {title: text for title, text in _benchmark_sections().items()
                if not title.startswith(("How to read", "Everyday"))}
    assert len(sections) >= 10
    for title, text in sections.items():
        for part in re.split(r"^### ", text, flags=re.M):
            assert "**Method.**" in part and "**Command" in part and "**Latest result**" in part, f"{title}: {part[:80]}"
            blocks = re.findall(r"```bash\n(.*?)```", part, re.S)
            assert blocks, f"{title}: no command block"
            for line in (ln for b in blocks for ln in b.replace("\\\n", " ").splitlines() if ln.strip()):
                script = re.search(r"(bench/[\w.]+)", line)
                assert script and (ROOT / script.group(1)).is_file(), f"{title}: {line} runs no script in bench/"
            latest = part.split("**Latest result**", 1)[1].split("\n\n", 1)[0]
            assert (re.search(r"20\d\d-\d\d-\d\d", latest) and "load" in latest) or "none yet" in latest, f"{title}: {latest}"
    everyday = _benchmark_sections()["Everyday figures"]
    rows = [r for r in everyday.splitlines() if r.startswith("| ") and not r.startswith(("| what", "| ---"))]
    assert rows and all(re.search(r"20\d\d-\d\d-\d\d, (idle|load|not recorded)", r) for r in rows), rows


def test_every_benchmark_script_is_on_the_page_and_every_cited_result_is_committed():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    scripts = {p.name for p in (ROOT / "bench").glob("*") if p.suffix in (".py", ".sh")} - BENCH_HELPERS
    assert all(f"bench/{s}" in page for s in scripts), sorted(s for s in scripts if f"bench/{s}" not in page)
    cited = set(re.findall(r"bench/results/([\w.-]+\.(?:json|md))", page))
    tracked = set(subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True).stdout.split())
    tracked = {Path(p).name for p in tracked}
    assert cited <= tracked, f"cited but not committed: {sorted(cited - tracked)}"
    assert tracked <= cited, f"committed but cited nowhere: {sorted(tracked - cited)}"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium at /usr/bin/chromium (scripts/system-deps)")
def test_search_finds_a_spec_key_by_its_last_part(site):
    """In Chromium, the built site's search box (lunr in a web worker, as a reader uses it, served over
    HTTP) finds the spec reference for `grad_clip_norm` and `early_stopping_patience`, which the page
    writes as `trainer.grad_clip_norm`: the separator splits words on dots and underscores."""
    import functools
    import http.server
    import threading

    from playwright.sync_api import expect, sync_playwright

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path="/usr/bin/chromium",
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                page = browser.new_page()
                page.set_default_timeout(60_000)
                for query in ("grad_clip_norm", "early_stopping_patience"):
                    page.goto(f"http://127.0.0.1:{server.server_port}/")
                    page.locator("input.md-search__input").click()
                    page.locator("input.md-search__input").press_sequentially(query, delay=20)
                    results = page.locator(".md-search-result__item")
                    expect(results.first).to_be_visible(timeout=60_000)
                    titles = [results.nth(i).locator("h1, h2").first.inner_text() for i in range(min(results.count(), 5))]
                    assert "Study spec" in titles, f"{query}: the first results are {titles}"
            finally:
                browser.close()
    finally:
        server.shutdown()
