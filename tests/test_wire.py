"""RESP packing of the node layer (``_wire``): the bytes every node gets for a command."""

from __future__ import annotations

import pytest

from redlock_async._nodes._wire import bulk, pack, pack_script, script_head
from redlock_async._scripts import QUEUE_LEAVE, RELEASE


@pytest.mark.parametrize("key_size", [1, 17, 255, 256, 1000])
@pytest.mark.parametrize("token_size", [0, 30, 255, 256, 400])
def test_a_script_head_and_its_bulk_arguments_are_the_bytes_pack_makes(key_size: int, token_size: int) -> None:
    keys = (b"k" * key_size, b"k" * key_size + b":q", b"{x}w", b"fence")
    token = b"t" * token_size
    expected = pack((b"EVALSHA", QUEUE_LEAVE.sha, len(keys), *keys, token))
    assert script_head(QUEUE_LEAVE, keys, 1) + bulk(token) == expected
    assert pack_script(QUEUE_LEAVE, keys, (token,)) == expected


def test_script_heads_of_one_script_with_other_shapes_differ() -> None:
    # The cached head carries the whole command's argument count: one per (script, keys, arguments).
    one = script_head(RELEASE, (b"a",), 1) + bulk(b"v")
    two = script_head(RELEASE, (b"a",), 2) + bulk(b"v") + bulk(b"w")
    assert one == pack((b"EVALSHA", RELEASE.sha, 1, b"a", b"v"))
    assert two == pack((b"EVALSHA", RELEASE.sha, 1, b"a", b"v", b"w"))
