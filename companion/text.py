"""Text as numbers: vocabularies, ids, padding, truncation and one-hot vectors.

Framework-free (NumPy only). The layers that turn ids into learned vectors live in ``companion.torch.text``
and ``companion.keras.text``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"


def tokenize(sentence: str, lowercase: bool = False) -> list[str]:
    """Split a sentence into word tokens; punctuation marks become tokens of their own.

    >>> tokenize("It was cold.")
    ['It', 'was', 'cold', '.']
    """
    if lowercase:
        sentence = sentence.lower()
    return re.findall(r"\w+(?:'\w+)?|[^\w\s]", sentence)


class Vocabulary:
    """A two-way mapping between tokens and integer ids.

    Id 0 is always the padding token. Further special tokens (unknown, start and end of sequence) are optional
    and take the next ids, so source 004's word-box example (``specials=()``) numbers its words from 1.

    Args:
        tokens: the ordinary tokens, in the order they get their ids (duplicates are ignored).
        specials: which of ``UNK``, ``BOS``, ``EOS`` to reserve after ``PAD``.
    """

    def __init__(self, tokens: Iterable[str] = (), specials: Sequence[str] = (UNK, BOS, EOS)):
        unknown = [s for s in specials if s not in (UNK, BOS, EOS)]
        if unknown:
            raise ValueError(f"specials may only contain {UNK!r}, {BOS!r}, {EOS!r}; got {unknown}")
        self._id_of: dict[str, int] = {}
        self._token_of: list[str] = []
        for token in (PAD, *specials):
            self._add(token)
        self.specials = (PAD, *specials)
        for token in tokens:
            self._add(token)

    @classmethod
    def from_sentences(
        cls, sentences: Iterable[str], specials: Sequence[str] = (UNK, BOS, EOS), lowercase: bool = False
    ) -> Vocabulary:
        """Build a vocabulary that numbers words in the order they first appear."""
        return cls((t for s in sentences for t in tokenize(s, lowercase)), specials=specials)

    def _add(self, token: str) -> None:
        if token not in self._id_of:
            self._id_of[token] = len(self._token_of)
            self._token_of.append(token)

    def __len__(self) -> int:
        return len(self._token_of)

    def __contains__(self, token: str) -> bool:
        return token in self._id_of

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)}, specials={self.specials})"

    @property
    def pad_id(self) -> int:
        return 0

    def _special_id(self, token: str) -> int:
        if token not in self._id_of:
            raise KeyError(f"this vocabulary has no {token!r} token; create it with specials=(..., {token!r})")
        return self._id_of[token]

    @property
    def unk_id(self) -> int:
        return self._special_id(UNK)

    @property
    def bos_id(self) -> int:
        return self._special_id(BOS)

    @property
    def eos_id(self) -> int:
        return self._special_id(EOS)

    @property
    def tokens(self) -> list[str]:
        """All tokens, indexed by id."""
        return list(self._token_of)

    def token_to_id(self, token: str) -> int:
        if token in self._id_of:
            return self._id_of[token]
        if UNK in self._id_of:
            return self._id_of[UNK]
        raise KeyError(f"unknown token {token!r} and this vocabulary has no {UNK!r} token")

    def id_to_token(self, token_id: int) -> str:
        if not 0 <= int(token_id) < len(self):
            raise ValueError(f"token_id must be in [0, {len(self)}); got {token_id}")
        return self._token_of[int(token_id)]

    def encode(self, sentence: str | Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Turn a sentence (a string or a list of tokens) into a list of ids."""
        tokens = tokenize(sentence) if isinstance(sentence, str) else list(sentence)
        ids = [self.token_to_id(t) for t in tokens]
        if add_bos:
            ids.insert(0, self.bos_id)
        if add_eos:
            ids.append(self.eos_id)
        return ids

    def decode(self, ids: Iterable[int], strip_special: bool = True) -> list[str]:
        """Turn ids back into tokens.

        With ``strip_special`` (the default) decoding stops at the end token and drops every other special token:
        padding, ``<s>`` and ``<unk>`` too, so an unknown word leaves no trace. ``strip_special=False`` keeps
        every token, the special ones included, and reads past the end token.
        """
        tokens = []
        for i in ids:
            token = self.id_to_token(int(i))
            if strip_special and token == EOS:
                break
            if strip_special and token in self.specials:
                continue
            tokens.append(token)
        return tokens


def pad_or_truncate(ids: Sequence[int], length: int, pad_id: int = 0) -> list[int]:
    """Cut ``ids`` to ``length`` or fill it with ``pad_id`` on the right until it has that length."""
    if length < 0:
        raise ValueError(f"length must be non-negative; got {length}")
    ids = list(ids)[:length]
    return ids + [pad_id] * (length - len(ids))


def pad_batch(batch: Sequence[Sequence[int]], length: int | None = None, pad_id: int = 0) -> np.ndarray:
    """Pad or truncate every sequence to ``length`` (default: the longest) and stack them.

    Returns:
        int64 array of shape ``(batch, length)``.
    """
    if length is None:
        length = max((len(s) for s in batch), default=0)
    return np.array([pad_or_truncate(s, length, pad_id) for s in batch], dtype=np.int64).reshape(len(batch), length)


def one_hot(ids: np.ndarray | Sequence, depth: int) -> np.ndarray:
    """One-hot vectors: ``ids`` of any shape ``(...)`` become float32 ``(..., depth)``.

    ``depth`` is the vocabulary size *including* PAD: the word-box example has 11 words plus PAD, so depth 12.
    """
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids must hold integers; got dtype {ids.dtype}")
    if ids.size and (ids.min() < 0 or ids.max() >= depth):
        raise ValueError(f"ids must lie in [0, depth={depth}); got values from {ids.min()} to {ids.max()}")
    return np.eye(depth, dtype=np.float32)[ids]


def check_shared_vocabulary(shared_embeddings: bool, src_vocab_size: int, tgt_vocab_size: int) -> None:
    """Raise ValueError when ``shared_embeddings`` asks for one table but the two vocabularies differ in size.

    Sharing the source embedding, the target embedding and the output layer (section 3.4 of the paper) needs one
    joint vocabulary: ``src_vocab_size == tgt_vocab_size``.
    """
    if shared_embeddings and src_vocab_size != tgt_vocab_size:
        raise ValueError(
            "shared_embeddings=True needs one joint vocabulary: src_vocab_size must equal tgt_vocab_size; got "
            f"{src_vocab_size} and {tgt_vocab_size}"
        )


#: The three sentences of the word-box game (source 004), already split into words.
WORD_BOX_SENTENCES = ["I went to the beach", "It was cold", "I came back to the house"]


# Subword tokenization (byte-level BPE) lives in its own module; it is part of the text toolbox.
from companion.bpe import BPE  # noqa: E402, F401
