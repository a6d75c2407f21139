"""MkDocs hooks (mkdocs.yml): one set of Markdown files reads right on GitHub and on the site.

* The README is the site's home page (``index.md``) and CHANGELOG.md its changelog
  (``changelog.md``), made from the files themselves, so nothing is written twice.
* A link from a page to a file outside ``docs/`` (``../examples/basic.py``, ``../redlock_async/_nodes/_node.py``;
  in the README, ``examples/basic.py``) is served as that file, copied into the site under
  ``source/``, and the link is pointed there; links to the README and the changelog go to their pages.
  A link to a file that does not exist is left alone, so that ``mkdocs build --strict`` fails on it.
* The docstrings' Sphinx roles (``:class:`Lock```, as Python's own docs write them) show as the code
  they name, without the role.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parent
LINK = re.compile(r"(\]\()([^)\s]+)(\))")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
ROLE = re.compile(r":(?:py:)?(?:class|attr|meth|func|exc|data|mod|obj):(?=<code)")
"""A Sphinx role left before the code it marks, once the docstring is HTML."""
GENERATED = {"README.md": "index.md", "CHANGELOG.md": "changelog.md"}
"""Repository files that are pages of the site: their path -> their page."""


def _is_external(target: str) -> bool:
    return target.startswith(("http://", "https://", "mailto:", "#"))


def _site_path(repo_path: str) -> str | None:
    """Where the file at *repo_path* (relative to the repository) is in the site, or None if nowhere."""
    if repo_path in GENERATED:
        return GENERATED[repo_path]
    if repo_path.startswith("docs/"):
        return repo_path.removeprefix("docs/")
    if (ROOT / repo_path).is_file():
        return "source/" + repo_path
    return None


def rewrite(markdown: str, repo_dir: str, site_dir: str) -> tuple[str, set[str]]:
    """*markdown* of a file in *repo_dir* (of the repository) shown in *site_dir* (of the site), with its
    links pointed at the site's files; and the repository files it links to that go under ``source/``."""
    wanted: set[str] = set()

    def one(match: re.Match[str]) -> str:
        target = match.group(2)
        if _is_external(target):
            return match.group(0)
        path, hash_, anchor = target.partition("#")
        repo_path = posixpath.normpath(posixpath.join(repo_dir, path))
        if repo_path.startswith("docs/") and repo_dir.startswith("docs"):
            return match.group(0)  # a page's link to another page: mkdocs checks it as it is
        site_path = _site_path(repo_path)
        if site_path is None:
            return match.group(0)  # broken: left for mkdocs to report
        if site_path.startswith("source/"):
            wanted.add(repo_path)
        relative = posixpath.relpath(site_path, site_dir or ".")
        return f"{match.group(1)}{relative}{hash_}{anchor}{match.group(3)}"

    # Code blocks are shown as written.
    pieces, last = [], 0
    for fence in FENCE.finditer(markdown):
        pieces.append(LINK.sub(one, markdown[last : fence.start()]))
        pieces.append(fence.group(0))
        last = fence.end()
    pieces.append(LINK.sub(one, markdown[last:]))
    return "".join(pieces), wanted


def _repo_dir(page_src_uri: str) -> tuple[str, str]:
    """(the page's directory in the repository, its directory in the site)."""
    for repo_path, site_path in GENERATED.items():
        if page_src_uri == site_path:
            return posixpath.dirname(repo_path), ""
    site_dir = posixpath.dirname(page_src_uri)
    return posixpath.join("docs", site_dir) if site_dir else "docs", site_dir


def on_files(files: Files, config: Any) -> Files:
    wanted: set[str] = set()
    for repo_path, site_path in GENERATED.items():
        text, links = rewrite((ROOT / repo_path).read_text(), posixpath.dirname(repo_path), "")
        files.append(File.generated(config, site_path, content=text))
        wanted |= links
    for file in list(files):
        if file.src_uri.endswith(".md") and file.src_uri not in GENERATED.values() and file.abs_src_path:
            repo_dir, site_dir = _repo_dir(file.src_uri)
            wanted |= rewrite(Path(file.abs_src_path).read_text(), repo_dir, site_dir)[1]
    for repo_path in sorted(wanted):
        files.append(File.generated(config, "source/" + repo_path, abs_src_path=str(ROOT / repo_path)))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    if page.file.src_uri in GENERATED.values():
        return markdown  # rewritten when it was made
    repo_dir, site_dir = _repo_dir(page.file.src_uri)
    return rewrite(markdown, repo_dir, site_dir)[0]


def on_page_content(html: str, page: Page, config: Any, files: Files) -> str:
    return ROLE.sub("", html)
