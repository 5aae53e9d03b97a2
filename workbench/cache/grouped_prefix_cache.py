"""Prefix caching when each KV group has its own blocks, and a sliding-window group lets go of the old ones.

With one group, a hit is the longest chain of cached blocks from the first (`workbench.cache.prefix_cache`). With
several, a hit of ``h`` blocks needs, in every full-attention group, all ``h`` blocks, and in a sliding-window
group **only the blocks the next query can still see**: those covering the last ``window - 1`` tokens before
position ``h x block_size``. The earlier ones may be gone (freed as the window slid, then evicted), and the hit
still holds. The longest ``h`` every group can serve is the hit (vLLM's hybrid manager searches it the same way).

Content identity is a trie of token blocks: node ``n`` stands for one exact prefix (its parent's prefix plus one
block of token ids), found by exact comparison of the token tuples, so two different prefixes never share a node
and a hit can never hand out the wrong KV, whichever blocks were evicted around it. Each group registers which of
its blocks holds a node's KV. Nodes are reference counted (by registrations, children and the sequences that
reached them) and disappear with their last reference.

Unreferenced registered blocks wait in one LRU pool across groups, as in the single-group cache; the block pool
(`workbench.cache.block_pool`) takes free blocks first and evicts from here only when none are left.
"""

from __future__ import annotations

from collections.abc import Sequence

from workbench.cache.kv_groups import KVGroup, first_needed_position
from workbench.cache.prefix_cache import ROOT, EvictablePool


class PrefixTrie:
    """Exact token-block prefixes as nodes; a node lives while something references it."""

    __slots__ = ("_children", "_nodes", "_refs", "_next")

    def __init__(self) -> None:
        self._children: dict[tuple[int, tuple[int, ...]], int] = {}
        self._nodes: dict[int, tuple[int, tuple[int, ...]]] = {}
        self._refs: dict[int, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def find(self, parent: int, tokens: tuple[int, ...]) -> int | None:
        return self._children.get((parent, tokens))

    def child(self, parent: int, tokens: tuple[int, ...]) -> int:
        """The node of ``tokens`` after ``parent`` (created if new), with one more reference for the caller."""
        node = self._children.get((parent, tokens))
        if node is None:
            node, self._next = self._next, self._next + 1
            self._children[(parent, tokens)] = node
            self._nodes[node] = (parent, tokens)
            self._refs[node] = 0
            if parent != ROOT:
                self.hold(parent)
        self.hold(node)
        return node

    def hold(self, node: int) -> None:
        self._refs[node] += 1

    def drop(self, node: int) -> None:
        """One reference fewer; a node without references is removed (and lets go of its parent)."""
        while node != ROOT:
            self._refs[node] -= 1
            if self._refs[node]:
                return
            parent, tokens = self._nodes.pop(node)
            del self._refs[node], self._children[(parent, tokens)]
            node = parent

    def path(self, token_ids: Sequence[int], max_blocks: int, block_size: int) -> list[int]:
        """Nodes of the longest prefix of ``token_ids`` the trie knows, at most ``max_blocks`` (no references)."""
        nodes, parent = [], ROOT
        for start in range(0, max_blocks * block_size, block_size):
            node = self._children.get((parent, tuple(token_ids[start:start + block_size])))
            if node is None:
                break
            nodes.append(node)
            parent = node
        return nodes


class GroupedPrefixCache(EvictablePool):
    """Which block of which group holds which prefix node, and the LRU pool of unreferenced ones."""

    __slots__ = ("groups", "trie", "_block_of", "_key_of")

    def __init__(self, groups: tuple[KVGroup, ...], block_size: int):
        super().__init__(block_size)
        self.groups = groups
        self.trie = PrefixTrie()
        self._block_of: dict[tuple[int, int], int] = {}  # (group, node) -> block
        self._key_of: dict[int, tuple[int, int]] = {}  # block -> (group, node)

    def __len__(self) -> int:
        return len(self._key_of)

    def __contains__(self, block: int) -> bool:
        return block in self._key_of

    def block(self, group: int, node: int) -> int | None:
        return self._block_of.get((group, node))

    def register(self, group: int, node: int, block: int) -> bool:
        """Make ``block`` the group's copy of ``node``; False if the group already has one (first come first
        served) or the block is registered already."""
        if (group, node) in self._block_of or block in self._key_of:
            return False
        self._block_of[(group, node)] = block
        self._key_of[block] = (group, node)
        self.trie.hold(node)
        return True

    # ------------------------------------------------------------------------------------------------ hits
    def needed_range(self, group: int, num_blocks: int) -> range:
        """Block indices a group must hold for a hit of ``num_blocks`` blocks: all of them for full attention,
        the window's for a sliding group."""
        first = first_needed_position(self.groups[group].window, num_blocks * self.block_size)
        return range(first // self.block_size, num_blocks)

    def hit(self, nodes: list[int]) -> int:
        """The longest prefix of ``nodes`` (a path of the trie) every group can serve, in blocks."""
        longest = len(nodes)
        for g, group in enumerate(self.groups):
            if not group.is_sliding:  # full attention: a contiguous chain from the first block
                longest = next((i for i, node in enumerate(nodes[:longest]) if (g, node) not in self._block_of),
                               longest)
        for h in range(longest, 0, -1):
            if all((g, nodes[i]) in self._block_of for g, group in enumerate(self.groups) if group.is_sliding
                   for i in self.needed_range(g, h)):
                return h
        return 0

    def lookup(self, token_ids: Sequence[int], max_blocks: int) -> list[int]:
        """Trie nodes of the longest cached prefix (at most ``max_blocks`` blocks). Changes nothing."""
        nodes = self.trie.path(token_ids, max_blocks, self.block_size)
        return nodes[:self.hit(nodes)]

    def _unregister(self, block: int) -> None:
        group, node = self._key_of.pop(block)
        del self._block_of[(group, node)]
        self.trie.drop(node)
