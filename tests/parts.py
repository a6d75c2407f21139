"""A lock's parts on fake nodes (no server): what tests/test_strategies.py, test_keeper.py and
test_guard.py share. Each node answers as a healthy node would, unless the test says otherwise
(:class:`Script` per node: ``"yes"``, ``"no"`` or ``"silent"`` for each kind of request)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redlock_async._core._settings import Settings
from redlock_async._lock._keeper import Keeper
from redlock_async._lock._strategies import Words
from redlock_async._nodes._wire import Reply
from redlock_async._rounds._lease import Tenure
from redlock_async._scripts import EXTEND, EXTEND_MANY, RELEASE
from redlock_async._shared._cluster import Cluster
from redlock_async._shared._handoff import Listener
from redlock_async.lock import Lock

from .fakes import NO_ANSWER, FakeNode, Request, as_nodes, fake_nodes


@dataclass
class Answers:
    """How one fake node answers each kind of request: "yes", "no" or "silent"."""

    acquire: str = "yes"
    extend: str = "yes"
    release: str = "yes"
    seen: list[str] = field(default_factory=list)

    def __call__(self, request: Request) -> Reply:
        command = request.args[0].upper()
        replies: dict[str, Reply]
        if command == b"SET":
            kind, replies = "acquire", {"yes": b"OK", "no": None}
        elif command in (b"EVALSHA", b"EVAL") and request.args[1] == EXTEND.sha:
            kind, replies = "extend", {"yes": 1, "no": 0}
        elif command in (b"EVALSHA", b"EVAL") and request.args[1] == EXTEND_MANY.sha:
            kind, replies = "extend", {"yes": [1], "no": [0]}
        elif command in (b"EVALSHA", b"EVAL") and request.args[1] == RELEASE.sha:
            kind, replies = "release", {"yes": 1, "no": 0}
        else:
            kind, replies = command.decode().lower(), {"yes": 1, "no": 0}
        self.seen.append(kind)
        how = getattr(self, kind, "yes")
        return NO_ANSWER if how == "silent" else replies[how]


def fake_cluster(n: int = 5, **settings: Any) -> tuple[Cluster, list[FakeNode], list[Answers]]:
    """A Cluster over *n* fake nodes, each answering through its :class:`Answers`."""
    answers = [Answers() for _ in range(n)]
    nodes = [FakeNode(node.name, respond=answer) for node, answer in zip(fake_nodes(n), answers, strict=True)]
    defaults: dict[str, Any] = {
        "ttl": 10.0,
        "node_timeout": 0.05,
        "clock_guard": False,
        "queue": False,
    }  # (release words: these fakes do not play the grant queue)
    cluster = Cluster(tuple(as_nodes(nodes)), Settings(**(defaults | settings)), Listener(0.05, scope=("parts",)), None)
    return cluster, nodes, answers


@dataclass
class Parts:
    cluster: Cluster
    nodes: list[FakeNode]
    answers: list[Answers]
    strategy: Words
    tenure: Tenure
    keeper: Keeper
    front: Keeper
    """What the held set keeps while the lock is held (the Tenure's *kept*): its keeper."""


def parts(n: int = 5, **settings: Any) -> Parts:
    """One lock's parts, built as ``Lock`` builds them, on fake nodes."""
    cluster, nodes, answers = fake_cluster(n, **settings)
    strategy = Words(cluster, cluster.settings, ("r",), None, "r")
    keeper = Keeper(strategy, cluster, cluster.settings, "r", "r", None)
    return Parts(cluster, nodes, answers, strategy, keeper.tenure, keeper, keeper)


def fake_lock(n: int = 5, **settings: Any) -> tuple[Lock, list[FakeNode], list[Answers]]:
    """A public Lock on fake nodes."""
    cluster, nodes, answers = fake_cluster(n, **settings)
    return Lock(cluster, "r", cluster.settings), nodes, answers


def say(answers: list[Answers], which: range | list[int], **how: str) -> None:
    """Nodes *which* answer from now on as *how* says (e.g. ``extend="no"``)."""
    for i in which:
        for kind, value in how.items():
            setattr(answers[i], kind, value)


def held(cluster: Cluster) -> list[object]:
    """The locks (fronts) *cluster* counts as held now."""
    return list(cluster.held)
