"""One connection per node: where it goes (endpoints), the handshake, the wire protocol (packing
commands, parsing replies), the auto-pipelined outbox and the node's load figures. Imports ``_core``.

This file is the wing's door: other modules of redlock_async import from here only."""

from __future__ import annotations

from redlock_async._nodes._cluster_voter import ClusterVoter
from redlock_async._nodes._endpoint import Endpoint, endpoints_for
from redlock_async._nodes._handshake import info_fields
from redlock_async._nodes._node import Node
from redlock_async._nodes._pubsub import ClusterSubscriber, messages, tell_refused
from redlock_async._nodes._replicas import replicated_outbox, wait_ms
from redlock_async._nodes._sentinel_voter import SwitchWatch
from redlock_async._nodes._slots import key_slot, tag_for
from redlock_async._nodes._wire import (
    IGNORED,
    Failure,
    Fallback,
    Reaction,
    Receiver,
    Reply,
    Resolve,
    bulk,
    pack,
    pack_script,
    script_head,
    server_error,
)

__all__ = [
    "IGNORED",
    "ClusterSubscriber",
    "ClusterVoter",
    "Endpoint",
    "Failure",
    "Fallback",
    "Node",
    "Reaction",
    "Receiver",
    "Reply",
    "Resolve",
    "SwitchWatch",
    "bulk",
    "endpoints_for",
    "info_fields",
    "key_slot",
    "messages",
    "pack",
    "pack_script",
    "replicated_outbox",
    "script_head",
    "server_error",
    "tag_for",
    "tell_refused",
    "wait_ms",
]
