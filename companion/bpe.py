"""Byte-level byte-pair encoding (BPE): a subword tokenizer trained from raw text, framework-free.

The tokenizer works on the UTF-8 bytes of the text, so every string (Chinese, emoji, code) can be encoded and
decoded back exactly, with no unknown token. Training starts from the 256 single bytes and repeatedly glues the
most frequent adjacent pair of tokens into a new token, until the vocabulary has the requested size.

The conventions follow GPT-2 and the Hugging Face ``tokenizers`` library, so that both give the same merges and
the same ids for the same corpus (``tests/test_bpe.py`` checks this):

- the text is first cut into "words" by GPT-2's regular expression (a word keeps the space in front of it, and
  merges never cross a word boundary);
- each byte is written as one printable character (:func:`byte_to_char`), the space becoming ``Ġ``, so tokens
  are readable strings such as ``"Ġthe"``;
- the 256 byte characters get ids 0..255 sorted by their character code, and every merge adds the next id;
- the most frequent pair wins; among equally frequent pairs, the one whose (left id, right id) is smallest.
"""

from __future__ import annotations

import functools
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from itertools import pairwise
from typing import Any

import regex

#: GPT-2's pre-tokenizer: contractions, letters, digits, other symbols (each with an optional leading space),
#: then runs of white space.
WORD_PATTERN = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

Pair = tuple[int, int]


@lru_cache(maxsize=1)
def _byte_chars() -> tuple[str, ...]:
    """GPT-2's table: byte ``b`` -> one printable character (printable bytes stand for themselves)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {}
    extra = 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:  # space, control characters, ...: moved to code points 256, 257, ...
            chars[b] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


def byte_to_char(b: int) -> str:
    """The printable character that stands for byte ``b`` in token strings (``byte_to_char(32) == "Ġ"``)."""
    return _byte_chars()[b]


def split_words(text: str) -> list[str]:
    """Cut ``text`` into the pieces that BPE merges inside: ``"I saw it."`` -> ``["I", " saw", " it", "."]``."""
    return WORD_PATTERN.findall(text)


def merge_pair(tokens: Sequence[int], pair: Pair, new_token: int) -> list[int]:
    """Replace every occurrence of ``pair`` in ``tokens`` by ``new_token``, scanning left to right.

    Occurrences do not overlap: with ``pair == (a, a)``, ``[a, a, a]`` becomes ``[new_token, a]``.
    """
    merged, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and tokens[i] == pair[0] and tokens[i + 1] == pair[1]:
            merged.append(new_token)
            i += 2
        else:
            merged.append(tokens[i])
            i += 1
    return merged


def count_pairs(words: dict[tuple[int, ...], int]) -> Counter:
    """How often each adjacent pair occurs, every word counted as often as it occurs in the corpus."""
    counts: Counter = Counter()
    for word, frequency in words.items():
        for pair in pairwise(word):
            counts[pair] += frequency
    return counts


class _new_or_in_place:
    """Method decorator: called on the class, the method runs on a new instance; on an instance, on that instance."""

    def __init__(self, function: Callable):
        self.function = function
        functools.update_wrapper(self, function)

    def __get__(self, instance: Any, owner: type) -> Callable:
        @functools.wraps(self.function)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return self.function(owner() if instance is None else instance, *args, **kwargs)

        return bound


class BPE:
    """A trained byte-level BPE tokenizer.

    Create one with :meth:`train`, or from a list of merges (pairs of token strings, in the order they were
    learned), e.g. ``BPE([("Ġ", "t"), ("h", "e"), ("Ġt", "he")])``.

    Attributes:
        vocab: token string -> id.
        merges: the learned merges as pairs of token strings, in order.
    """

    def __init__(self, merges: Iterable[tuple[str, str]] = ()):
        alphabet = sorted(_byte_chars())  # ids 0..255, in the order of the characters' code points
        self.vocab: dict[str, int] = {token: i for i, token in enumerate(alphabet)}
        self._tokens: list[str] = list(alphabet)  # id -> token string
        self.merges: list[tuple[str, str]] = []
        self._rank: dict[Pair, int] = {}  # (left id, right id) -> position of that merge in the list
        self._merged_id: dict[Pair, int] = {}  # (left id, right id) -> id of the merged token
        for left, right in merges:
            self._add_merge(left, right)
        self._byte_ids = [self.vocab[c] for c in _byte_chars()]  # byte value -> id
        self._char_byte = {c: b for b, c in enumerate(_byte_chars())}
        self._cache: dict[str, list[int]] = {}

    def _add_merge(self, left: str, right: str) -> int:
        for side, token in (("left", left), ("right", right)):
            if token not in self.vocab:
                raise ValueError(f"merge ({left!r}, {right!r}): the {side} token is not in the vocabulary yet")
        pair = (self.vocab[left], self.vocab[right])
        new_id = self.vocab.setdefault(left + right, len(self.vocab))  # two merges may build the same string
        if new_id == len(self._tokens):
            self._tokens.append(left + right)
        self._rank[pair] = len(self.merges)
        self._merged_id[pair] = new_id
        self.merges.append((left, right))
        return new_id

    def __len__(self) -> int:
        return len(self.vocab)

    def __repr__(self) -> str:
        return f"BPE(vocab_size={len(self)}, merges={len(self.merges)})"

    @_new_or_in_place
    def train(self, texts: Iterable[str], vocab_size: int) -> BPE:
        """Learn merges from ``texts`` until the vocabulary holds ``vocab_size`` tokens (or nothing is left to merge).

        ``BPE.train(texts, n)`` returns a new tokenizer; ``bpe = BPE(); bpe.train(texts, n)`` trains ``bpe`` itself
        (and returns it), as Hugging Face ``tokenizers`` and ``minbpe`` do.

        Args:
            texts: the training corpus, one string per document.
            vocab_size: the size of the final vocabulary, the 256 bytes included; at least 256.
        """
        if vocab_size < 256:
            raise ValueError(f"vocab_size must be at least 256 (one token per byte); got {vocab_size}")
        if self.merges:
            raise ValueError(f"train: this tokenizer already has {len(self.merges)} merges; train a new BPE() instead")
        bpe = self
        bpe._cache.clear()
        # Count every distinct word once, as a tuple of byte ids: merges happen inside words.
        word_counts = Counter(word for text in texts for word in split_words(text))
        words = [[bpe._byte_ids[b] for b in word.encode("utf-8")] for word in word_counts]
        frequency = list(word_counts.values())

        pair_counts: Counter = Counter()
        where: dict[Pair, set[int]] = {}  # pair -> indices of the words that contain it
        for w, word in enumerate(words):
            for pair in pairwise(word):
                pair_counts[pair] += frequency[w]
                where.setdefault(pair, set()).add(w)
        # A max-heap of (-count, left, right): the top is the most frequent pair, ties to the smallest ids.
        # Counts only change for the pairs next to a merge; stale entries are corrected when they surface.
        heap = [(-count, *pair) for pair, count in pair_counts.items()]
        heapq.heapify(heap)

        while len(bpe.vocab) < vocab_size and heap:
            negative_count, left, right = heapq.heappop(heap)
            pair = (left, right)
            if -negative_count != pair_counts[pair]:  # stale: push the current count back
                if pair_counts[pair] > 0:
                    heapq.heappush(heap, (-pair_counts[pair], left, right))
                continue
            if pair_counts[pair] < 1:
                break
            new_id = bpe._add_merge(bpe._tokens[left], bpe._tokens[right])
            changed = set()
            for w in where.pop(pair):
                old = words[w]
                new = merge_pair(old, pair, new_id)
                if new == old:
                    continue
                for p in pairwise(old):
                    pair_counts[p] -= frequency[w]
                for p in pairwise(new):
                    pair_counts[p] += frequency[w]
                    where.setdefault(p, set()).add(w)
                    changed.add(p)
                words[w] = new
            del pair_counts[pair]
            for p in changed:  # pairs that gained occurrences (all contain the new token)
                if pair_counts[p] > 0:
                    heapq.heappush(heap, (-pair_counts[p], *p))
        return bpe

    def _encode_word(self, word: str) -> list[int]:
        """Apply the merges to one word: always the earliest-learned merge that is present, until none is."""
        if word in self._cache:
            return self._cache[word]
        ids = [self._byte_ids[b] for b in word.encode("utf-8")]
        while len(ids) > 1:
            ranked = [(self._rank[p], p) for p in pairwise(ids) if p in self._rank]
            if not ranked:
                break
            _, pair = min(ranked)
            ids = merge_pair(ids, pair, self._merged_id[pair])
        self._cache[word] = ids
        return ids

    def encode(self, text: str) -> list[int]:
        """Text -> token ids."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str; got {type(text).__name__}")
        return [i for word in split_words(text) for i in self._encode_word(word)]

    def tokens(self, text: str) -> list[str]:
        """Text -> token strings (``Ġ`` marks a space), to look at how a text is cut."""
        return [self._tokens[i] for i in self.encode(text)]

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids -> text. Byte sequences that are not valid UTF-8 (a cut inside a character) become U+FFFD."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < len(self)]
        if bad:
            raise ValueError(f"ids must lie in [0, {len(self)}); got {bad[0]}")
        chars = "".join(self._tokens[i] for i in ids)
        return bytes(self._char_byte[c] for c in chars).decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> int:
        return self.vocab[token]

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= int(token_id) < len(self):
            raise ValueError(f"token_id must be in [0, {len(self)}); got {token_id}")
        return self._tokens[int(token_id)]
