"""Chained hashes of full KV blocks, the keys of the prefix cache.

Block i's hash covers (hash of block i-1, the block's token ids), so equal hashes mean equal
whole prefixes, not just equal blocks. A request's cache_salt (vLLM's per-tenant prefix-cache
isolation) replaces block 0's parent by a hash of the salt, so requests with different salts
never share a block (nor can one time the other's hits), while those with the same salt, or
none, do; every block after the first inherits it through the chain. A keyed cryptographic digest (BLAKE2b, 128 bits) keeps
collisions out of reach and gives the same value in every process (Python's `hash()` of bytes
is salted per process), which a disaggregated prefill/decode pair needs.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

BlockHash = bytes

# Parent of block 0; any fixed value works, a named one reads better in debugging.
ROOT_BLOCK_HASH: BlockHash = b"cadence-root-block"


def hash_block_tokens(parent_hash: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    """Hash of one full block given its parent's hash: h(parent_hash, tuple(token_ids))."""
    digest = hashlib.blake2b(parent_hash, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def root_block_hash(cache_salt: str | None = None) -> BlockHash:
    """Parent of block 0: the fixed root, or for a salted request a digest of its salt."""
    if cache_salt is None:
        return ROOT_BLOCK_HASH
    digest = hashlib.blake2b(ROOT_BLOCK_HASH + b"/cache_salt/", digest_size=16)
    digest.update(cache_salt.encode("utf-8"))
    return digest.digest()


def extend_block_hashes(
    block_hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
    cache_salt: str | None = None, max_blocks: int | None = None,
) -> None:
    """Append the hashes of the full blocks of `token_ids` not yet in `block_hashes` (in place),
    up to `max_blocks` hashes in all when given (a lookup that may stop early hashes no more
    than it reads); `cache_salt` must be the same on every call for one request."""
    num_full_blocks = len(token_ids) // block_size
    if max_blocks is not None:
        num_full_blocks = min(num_full_blocks, max_blocks)
    for i in range(len(block_hashes), num_full_blocks):
        parent = block_hashes[i - 1] if i > 0 else root_block_hash(cache_salt)
        block_hashes.append(
            hash_block_tokens(parent, token_ids[i * block_size : (i + 1) * block_size])
        )


def leading_blocks_held(block_hashes, is_held) -> int:
    """How many leading blocks of a chain `is_held(hash)` says are cached: hashes chain, so the
    first miss ends the prefix (the router's event view, its affinity map and the simulated
    fleet all count prefixes this way)."""
    n = 0
    for h in block_hashes:
        if not is_held(h):
            break
        n += 1
    return n
