"""Parallel sentence pairs for the full model: a toy translation corpus made in code, a loader for real
tab-separated pair files, and batching into padded id arrays. Framework-free (NumPy only).

The toy corpus translates a small fragment of English into a French-like language whose rules force the model
to do more than copy words one by one:

* most adjectives (colours, moods) move **after** the noun; size and age adjectives stay before it:
  ``the big black dog`` -> ``le grand chien noir``;
* articles, possessives, demonstratives and adjectives **agree** with the noun in gender and number:
  ``the white cat`` -> ``le chat blanc`` but ``the white cars`` -> ``les voitures blanches``;
* the plural indefinite article ``des`` becomes ``de`` when an adjective stands before the noun:
  ``some cars`` -> ``des voitures`` but ``some big cars`` -> ``de grandes voitures``;
* verbs agree with the subject: ``the dog sleeps`` -> ``le chien dort``, ``the dogs sleep`` -> ``les chiens dorment``;
* negation wraps the verb: ``the dog does not sleep`` -> ``le chien ne dort pas``, ``is not`` -> ``n'est pas``;
* optionally (``numbers=...``), a cardinal number from 2 to 99 replaces the determiner of a plural noun phrase,
  spelled out by ``num2words`` in both languages with the hyphens written as spaces, so the French number is
  built from the same parts by different rules: ``seventy eight black cats`` -> ``soixante dix huit chats
  noirs``, ``twenty one houses`` -> ``vingt et une maisons`` (the "one" agrees with a feminine noun).

:func:`held_out_corpus` adds two test sets that measure generalisation rather than memory: sentences longer than
every training sentence, and sentences with numbers that never occur in training (although each of their words
does, in other numbers).

Everything is deterministic given a seed, and the train, validation and test splits never share a source
sentence (so they never share a pair either: the translation is a function of the source).
"""

from __future__ import annotations

import functools
import random
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .text import BOS, EOS, UNK, Vocabulary, pad_batch, tokenize

Pair = tuple[str, str]

# ---------------------------------------------------------------------------------------------------------------
# The toy grammar
# ---------------------------------------------------------------------------------------------------------------

#: (English singular, English plural, French singular, French plural, gender "m" or "f")
NOUNS: tuple[tuple[str, str, str, str, str], ...] = (
    ("dog", "dogs", "chien", "chiens", "m"),
    ("cat", "cats", "chat", "chats", "m"),
    ("horse", "horses", "cheval", "chevaux", "m"),
    ("boy", "boys", "garçon", "garçons", "m"),
    ("book", "books", "livre", "livres", "m"),
    ("duck", "ducks", "canard", "canards", "m"),
    ("girl", "girls", "fille", "filles", "f"),
    ("car", "cars", "voiture", "voitures", "f"),
    ("house", "houses", "maison", "maisons", "f"),
    ("flower", "flowers", "fleur", "fleurs", "f"),
    ("mouse", "mice", "souris", "souris", "f"),
    ("table", "tables", "table", "tables", "f"),
)

#: English, then the French forms masculine singular, feminine singular, masculine plural, feminine plural.
#: These stand before the noun, as in English.
ADJECTIVES_BEFORE: tuple[tuple[str, str, str, str, str], ...] = (
    ("big", "grand", "grande", "grands", "grandes"),
    ("small", "petit", "petite", "petits", "petites"),
    ("old", "vieux", "vieille", "vieux", "vieilles"),
    ("pretty", "joli", "jolie", "jolis", "jolies"),
)
#: These move after the noun.
ADJECTIVES_AFTER: tuple[tuple[str, str, str, str, str], ...] = (
    ("red", "rouge", "rouge", "rouges", "rouges"),
    ("black", "noir", "noire", "noirs", "noires"),
    ("white", "blanc", "blanche", "blancs", "blanches"),
    ("green", "vert", "verte", "verts", "vertes"),
    ("happy", "content", "contente", "contents", "contentes"),
    ("sad", "triste", "triste", "tristes", "tristes"),
)

#: English singular, English plural, French masculine singular, feminine singular, plural.
DETERMINERS: tuple[tuple[str, str, str, str, str], ...] = (
    ("the", "the", "le", "la", "les"),
    ("a", "some", "un", "une", "des"),
    ("my", "my", "mon", "ma", "mes"),
    ("this", "these", "ce", "cette", "ces"),
)

#: English third person singular, English base form, French singular, French plural.
INTRANSITIVE_VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("sleeps", "sleep", "dort", "dorment"),
    ("runs", "run", "court", "courent"),
    ("eats", "eat", "mange", "mangent"),
    ("sings", "sing", "chante", "chantent"),
    ("jumps", "jump", "saute", "sautent"),
)
TRANSITIVE_VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("sees", "see", "voit", "voient"),
    ("watches", "watch", "regarde", "regardent"),
    ("follows", "follow", "suit", "suivent"),
    ("wants", "want", "veut", "veulent"),
    ("finds", "find", "trouve", "trouvent"),
)


#: Numbers that can stand as determiners of a plural noun phrase.
NUMBERS: tuple[int, ...] = tuple(range(2, 100))
#: The numbers kept out of the training sentences of :func:`held_out_corpus`: one per tens word, one per unit word
#: (23 34 45 ... 89, then 91), so that every word they are made of still occurs in training, in other numbers.
HELD_OUT_NUMBERS: tuple[int, ...] = (23, 34, 45, 56, 67, 78, 89, 91)


def number_words(number: int, language: str = "en", gender: str = "m") -> list[str]:
    """A cardinal number spelled out by ``num2words``, hyphens written as spaces, as a list of words.

    >>> number_words(78), number_words(78, "fr"), number_words(21, "fr", gender="f")
    (['seventy', 'eight'], ['soixante', 'dix', 'huit'], ['vingt', 'et', 'une'])
    """
    if language not in ("en", "fr"):
        raise ValueError(f"language must be 'en' or 'fr'; got {language!r}")
    if not isinstance(number, int) or number < 0:
        raise ValueError(f"number must be a non-negative integer; got {number!r}")
    words = list(_spelled(number, language))
    if language == "fr" and gender == "f" and words[-1] == "un":
        words[-1] = "une"
    return words


@functools.lru_cache(maxsize=1024)
def _spelled(number: int, language: str) -> tuple[str, ...]:
    from num2words import num2words  # slow enough (a few ms a call) to be worth the cache

    return tuple(num2words(number, lang=language).replace("-", " ").split())


def _form(forms: Sequence[str], gender: str, plural: bool) -> str:
    """Pick one of the four forms (m sg, f sg, m pl, f pl) of an adjective."""
    return forms[(2 if plural else 0) + (1 if gender == "f" else 0)]


@dataclass(frozen=True)
class NounPhrase:
    """A noun phrase in both languages, with the number and gender the rest of the sentence agrees with."""

    english: list[str]
    french: list[str]
    plural: bool
    gender: str


def _lookup(table: Sequence[tuple[str, ...]], english: str, what: str) -> tuple[str, ...]:
    """The row of ``table`` whose first column is the English word ``english``."""
    for row in table:
        if row[0] == english:
            return row
    raise ValueError(f"{what} must be one of {[row[0] for row in table]}; got {english!r}")


def noun_phrase(
    determiner: str | int, noun: str, plural: bool = False, before: str | None = None, after: str | None = None
) -> NounPhrase:
    """Build one noun phrase of the toy grammar from English words.

    Args:
        determiner: ``"the"``, ``"a"``, ``"my"`` or ``"this"`` (their plurals are chosen from ``plural``), or a
            number of :data:`NUMBERS` (then ``plural`` must be True).
        noun: an English noun of :data:`NOUNS` (singular form).
        plural: singular or plural.
        before: an adjective of :data:`ADJECTIVES_BEFORE` (it stays before the noun in French), or None.
        after: an adjective of :data:`ADJECTIVES_AFTER` (it moves after the noun in French), or None.

    >>> phrase = noun_phrase("a", "car", plural=True, before="big", after="white")
    >>> " ".join(phrase.english), " ".join(phrase.french)
    ('some big white cars', 'de grandes voitures blanches')
    """
    if isinstance(determiner, int):
        return _number_phrase(determiner, noun, plural, before, after)
    en_sg, en_pl, fr_sg, fr_pl, gender = _lookup(NOUNS, noun, "noun")
    det = _lookup(DETERMINERS, determiner, "determiner")
    adjective_before = _lookup(ADJECTIVES_BEFORE, before, "before") if before is not None else None
    adjective_after = _lookup(ADJECTIVES_AFTER, after, "after") if after is not None else None

    english_adjectives = [a[0] for a in (adjective_before, adjective_after) if a is not None]  # English: all first
    english_noun = en_pl if plural else en_sg
    english_det = det[1] if plural else det[0]
    if english_det == "a" and (english_adjectives or [english_noun])[0][0] in "aeiou":
        english_det = "an"
    english = [english_det, *english_adjectives, english_noun]

    if plural:
        french_det = "de" if det[4] == "des" and adjective_before is not None else det[4]
    else:
        french_det = det[3] if gender == "f" else det[2]
    french = [french_det]
    if adjective_before is not None:
        french.append(_form(adjective_before[1:], gender, plural))
    french.append(fr_pl if plural else fr_sg)
    if adjective_after is not None:
        french.append(_form(adjective_after[1:], gender, plural))
    return NounPhrase(english, french, plural, gender)


def _number_phrase(number: int, noun: str, plural: bool, before: str | None, after: str | None) -> NounPhrase:
    """``noun_phrase`` with a cardinal number as its determiner."""
    if number not in NUMBERS or not plural:
        raise ValueError(
            f"a number determiner must be one of {NUMBERS[0]}..{NUMBERS[-1]} with plural=True; got {number!r} "
            f"and plural={plural}"
        )
    phrase = noun_phrase("the", noun, True, before, after)  # "the" and "les": one word each, replaced below
    english = number_words(number, "en") + phrase.english[1:]
    french = number_words(number, "fr", phrase.gender) + phrase.french[1:]
    return NounPhrase(english, french, True, phrase.gender)


#: How often a noun phrase gets a number as its determiner when numbers are on.
NUMBER_RATE = 0.3


def _random_noun_phrase(rng: random.Random, numbers: Sequence[int] = ()) -> NounPhrase:
    """A random noun phrase: determiner (or, when ``numbers`` is not empty, sometimes one of them), optional
    adjective before, noun, optional adjective after."""
    noun = rng.choice(NOUNS)[0]
    determiner: str | int = rng.choice(DETERMINERS)[0]
    plural = rng.random() < 0.5
    if numbers and rng.random() < NUMBER_RATE:  # no extra draw without numbers: the old corpora stay the same
        determiner, plural = rng.choice(numbers), True
    before = rng.choice(ADJECTIVES_BEFORE)[0] if rng.random() < 0.5 else None
    after = rng.choice(ADJECTIVES_AFTER)[0] if rng.random() < 0.5 else None
    return noun_phrase(determiner, noun, plural, before, after)


def toy_sentence_pair(rng: random.Random, numbers: Sequence[int] = ()) -> Pair:
    """One random (English, French-like) pair of the toy grammar; see the module docstring for its rules.

    ``numbers``: the cardinal numbers a noun phrase may start with (none by default).
    """
    subject = _random_noun_phrase(rng, numbers)
    negative = rng.random() < 0.3
    kind = rng.choice(("intransitive", "transitive", "copula"))
    english, french = list(subject.english), list(subject.french)
    if kind == "copula":
        adjective = rng.choice(ADJECTIVES_BEFORE + ADJECTIVES_AFTER)
        english += ["are" if subject.plural else "is"] + (["not"] if negative else []) + [adjective[0]]
        verb = "sont" if subject.plural else "est"
        if negative:
            french += ["ne", verb, "pas"] if subject.plural else ["n'est", "pas"]
        else:
            french.append(verb)
        french.append(_form(adjective[1:], subject.gender, subject.plural))
    else:
        verbs = INTRANSITIVE_VERBS if kind == "intransitive" else TRANSITIVE_VERBS
        en_3sg, en_base, fr_sg, fr_pl = rng.choice(verbs)
        french_verb = fr_pl if subject.plural else fr_sg
        if negative:
            english += ["do" if subject.plural else "does", "not", en_base]
            french += ["ne", french_verb, "pas"]
        else:
            english.append(en_base if subject.plural else en_3sg)
            french.append(french_verb)
        if kind == "transitive":
            obj = _random_noun_phrase(rng, numbers)
            english += obj.english
            french += obj.french
    return " ".join(english), " ".join(french)


def toy_translation_pairs(num_pairs: int, seed: int = 0, numbers: Sequence[int] = ()) -> list[Pair]:
    """``num_pairs`` pairs of the toy grammar with pairwise different sources, in a seeded random order.

    ``numbers``: the cardinal numbers a noun phrase may start with (none by default).
    """
    if num_pairs < 1:
        raise ValueError(f"num_pairs must be a positive integer; got {num_pairs}")
    rng = random.Random(seed)
    pairs: dict[str, str] = {}
    attempts = 0
    while len(pairs) < num_pairs:
        attempts += 1
        if attempts > 50 * num_pairs:
            raise ValueError(f"num_pairs={num_pairs} is more than the grammar produces in reasonable time")
        source, target = toy_sentence_pair(rng, numbers)
        pairs.setdefault(source, target)
    return list(pairs.items())


@dataclass(frozen=True)
class Splits:
    """A corpus cut into three parts that share no source sentence."""

    train: list[Pair]
    validation: list[Pair]
    test: list[Pair]

    def __repr__(self) -> str:
        return f"Splits(train={len(self.train)}, validation={len(self.validation)}, test={len(self.test)})"


def split_pairs(pairs: Sequence[Pair], num_validation: int, num_test: int, seed: int = 0) -> Splits:
    """Shuffle ``pairs`` with ``seed`` and cut off ``num_validation`` and ``num_test`` of them.

    A source sentence that occurs more than once (possible in real data) goes wholly to one split.
    """
    if num_validation < 0 or num_test < 0:
        raise ValueError(f"num_validation and num_test must be >= 0; got {num_validation} and {num_test}")
    groups: dict[str, list[Pair]] = {}
    for pair in pairs:
        groups.setdefault(pair[0], []).append(pair)
    sources = list(groups)
    if num_validation + num_test >= len(sources):
        raise ValueError(
            f"num_validation + num_test = {num_validation + num_test} leaves no training pair out of "
            f"{len(sources)} distinct sources"
        )
    random.Random(seed).shuffle(sources)

    def take(part: list[str]) -> list[Pair]:
        return [pair for source in part for pair in groups[source]]

    return Splits(
        train=take(sources[num_validation + num_test :]),
        validation=take(sources[:num_validation]),
        test=take(sources[num_validation : num_validation + num_test]),
    )


def toy_corpus(num_train: int = 6000, num_validation: int = 500, num_test: int = 1000, seed: int = 0) -> Splits:
    """The chapter's data set: toy pairs split into train, validation and test with no shared source."""
    pairs = toy_translation_pairs(num_train + num_validation + num_test, seed)
    return split_pairs(pairs, num_validation, num_test, seed)


@dataclass(frozen=True, repr=False)
class HeldOutSplits(Splits):
    """:class:`Splits` plus two test sets built to be out of the training distribution.

    ``longer``: sentences with more source words than any training sentence (at most ``max_train_tokens`` there).
    ``numbers``: sentences holding one of ``held_out_numbers``, numbers that occur in no training sentence.
    ``numbers`` sentences are no longer than training ones, and ``longer`` ones hold no held-out number, so each
    set tests one thing. ``test`` is drawn like ``train``.
    """

    longer: list[Pair]
    numbers: list[Pair]
    max_train_tokens: int
    held_out_numbers: tuple[int, ...]

    def __repr__(self) -> str:
        return (
            f"HeldOutSplits(train={len(self.train)}, validation={len(self.validation)}, test={len(self.test)}, "
            f"longer={len(self.longer)}, numbers={len(self.numbers)})"
        )


def held_out_corpus(
    num_train: int = 6000,
    num_validation: int = 500,
    num_test: int = 1000,
    num_longer: int = 500,
    num_numbers: int = 500,
    max_train_tokens: int = 10,
    held_out_numbers: Sequence[int] = HELD_OUT_NUMBERS,
    seed: int = 0,
) -> HeldOutSplits:
    """The toy grammar with numbers, cut into training data and three test sets (see :class:`HeldOutSplits`).

    Sentences are drawn (distinct sources) until every part is full: a sentence with a held-out number goes to
    ``numbers`` if it has at most ``max_train_tokens`` source words (else nowhere), a longer one to ``longer``,
    the rest to the pool that :func:`split_pairs` cuts into train, validation and test.
    """
    for name, value in {"num_train": num_train, "num_longer": num_longer, "num_numbers": num_numbers,
                        "max_train_tokens": max_train_tokens}.items():
        if value < 1:
            raise ValueError(f"{name} must be a positive integer; got {value}")
    held = tuple(held_out_numbers)
    if not held or not set(held) < set(NUMBERS):
        raise ValueError(f"held_out_numbers must be some, not all, of {NUMBERS[0]}..{NUMBERS[-1]}; got {held}")
    seen_numbers = [n for n in NUMBERS if n not in held]
    held_words = [" " + " ".join(number_words(n)) + " " for n in held]
    rng = random.Random(seed)
    wanted_pool = num_train + num_validation + num_test
    pool: dict[str, str] = {}
    longer: dict[str, str] = {}
    numbers: dict[str, str] = {}
    drawn: set[str] = set()
    limit = 100 * (wanted_pool + num_longer + num_numbers)
    while len(pool) < wanted_pool or len(longer) < num_longer or len(numbers) < num_numbers:
        if len(drawn) > limit:
            raise ValueError("the grammar does not produce enough sentences for these sizes")
        # Three draws in two of four sentences come from all the numbers, so that held-out ones occur at all.
        source, target = toy_sentence_pair(rng, NUMBERS if rng.random() < 0.5 else seen_numbers)
        if source in drawn:
            continue
        drawn.add(source)
        length = len(source.split())
        if any(words in f" {source} " for words in held_words):
            part, size = (numbers, num_numbers) if length <= max_train_tokens else (None, 0)
        elif length > max_train_tokens:
            part, size = longer, num_longer
        else:
            part, size = pool, wanted_pool
        if part is not None and len(part) < size:
            part[source] = target
    splits = split_pairs(list(pool.items()), num_validation, num_test, seed)
    return HeldOutSplits(splits.train, splits.validation, splits.test, list(longer.items()), list(numbers.items()),
                         max_train_tokens, held)


# ---------------------------------------------------------------------------------------------------------------
# Real sentence pairs (the Tatoeba / Anki format)
# ---------------------------------------------------------------------------------------------------------------

_SPACES = {"\u00a0": " ", "\u202f": " ", "\u2009": " "}  # no-break spaces in French punctuation, thin space


def normalize_sentence(sentence: str, lowercase: bool = False) -> str:
    """NFC-normalize, turn no-break and thin spaces into plain ones, collapse runs of whitespace."""
    sentence = unicodedata.normalize("NFC", sentence)
    for odd, plain in _SPACES.items():
        sentence = sentence.replace(odd, plain)
    sentence = " ".join(sentence.split())
    return sentence.lower() if lowercase else sentence


def load_sentence_pairs(
    path: str | Path,
    lowercase: bool = False,
    max_pairs: int | None = None,
    max_tokens: int | None = None,
) -> list[Pair]:
    """Read a tab-separated file of sentence pairs, one pair per line: ``source<TAB>target[<TAB>attribution]``.

    This is the layout of the Tatoeba pairs distributed for Anki (a third column credits the authors). Blank
    lines and lines starting with ``#`` are skipped; columns after the second are ignored.

    Args:
        path: the ``.tsv`` / ``.txt`` file (UTF-8).
        lowercase: lowercase both sides.
        max_pairs: keep only the first pairs read (after filtering).
        max_tokens: drop pairs where either side has more tokens than this (see ``companion.text.tokenize``).

    Returns:
        a list of ``(source, target)`` strings with normalized whitespace.
    """
    pairs: list[Pair] = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.startswith("#"):
                continue
            columns = line.split("\t")
            if len(columns) < 2 or not columns[0].strip() or not columns[1].strip():
                raise ValueError(
                    f"{path}, line {number}: expected 'source<TAB>target[<TAB>attribution]'; got {line!r}"
                )
            source, target = (normalize_sentence(c, lowercase) for c in columns[:2])
            if max_tokens is not None and max(len(tokenize(source)), len(tokenize(target))) > max_tokens:
                continue
            pairs.append((source, target))
            if max_pairs is not None and len(pairs) >= max_pairs:
                break
    return pairs


# ---------------------------------------------------------------------------------------------------------------
# From pairs to padded id arrays
# ---------------------------------------------------------------------------------------------------------------


def build_vocabularies(pairs: Sequence[Pair], min_count: int = 1) -> tuple[Vocabulary, Vocabulary]:
    """A source and a target vocabulary (PAD=0, UNK, BOS, EOS, then words by first appearance).

    Words seen fewer than ``min_count`` times are left out and will be encoded as ``<unk>``.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    vocabularies = []
    for side in (0, 1):
        counts = Counter(token for pair in pairs for token in tokenize(pair[side]))
        tokens = [token for token in counts if counts[token] >= min_count]  # Counter keeps first-seen order
        vocabularies.append(Vocabulary(tokens, specials=(UNK, BOS, EOS)))
    return vocabularies[0], vocabularies[1]


def build_joint_vocabulary(pairs: Sequence[Pair], min_count: int = 1) -> Vocabulary:
    """One vocabulary for both sides (PAD=0, UNK, BOS, EOS, then words by first appearance, source side first).

    This is what a Transformer with ``shared_embeddings=True`` needs: a word spelled the same in both languages
    ("table") gets one id and one vector. Words seen fewer than ``min_count`` times become ``<unk>``.
    """
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    counts = Counter(token for pair in pairs for side in pair for token in tokenize(side))
    return Vocabulary([token for token in counts if counts[token] >= min_count], specials=(UNK, BOS, EOS))


def encode_sentences(sentences: Sequence[str], vocab: Vocabulary, length: int | None = None) -> np.ndarray:
    """``<s> w1 ... wn </s>`` for every sentence, padded with PAD (0) on the right.

    Args:
        sentences: strings (tokenized with ``companion.text.tokenize``) or lists of tokens.
        vocab: a vocabulary with ``<s>`` and ``</s>``.
        length: the width of the array; default the longest sentence plus 2. A sentence that does not fit
            raises ValueError (cutting it would drop its ``</s>``).

    Returns:
        int64 array ``(batch, length)``.
    """
    ids = [vocab.encode(s, add_bos=True, add_eos=True) for s in sentences]
    longest = max((len(i) for i in ids), default=0)
    if length is not None and longest > length:
        raise ValueError(f"length={length} is too short: the longest sentence needs {longest} ids with <s> and </s>")
    return pad_batch(ids, length if length is not None else longest, vocab.pad_id)


def encode_pairs(
    pairs: Sequence[Pair], src_vocab: Vocabulary, tgt_vocab: Vocabulary, length: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Both sides of ``pairs`` as padded id arrays ``(num_pairs, src_len)`` and ``(num_pairs, tgt_len)``."""
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    sources, targets = zip(*pairs, strict=True)
    return encode_sentences(sources, src_vocab, length), encode_sentences(targets, tgt_vocab, length)


def decode_ids(ids: np.ndarray | Sequence[Sequence[int]], vocab: Vocabulary) -> list[str]:
    """Turn id rows ``(batch, seq_len)`` back into sentences: stop at ``</s>``, drop PAD and ``<s>``."""
    return [" ".join(vocab.decode(row)) for row in np.asarray(ids).tolist()]


def iterate_batches(
    src_ids: np.ndarray,
    tgt_ids: np.ndarray,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    trim: bool = False,
    pad_id: int = 0,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Yield ``(src, tgt)`` batches of ``batch_size`` rows, ``(batch, src_len)`` and ``(batch, tgt_len)``.

    Args:
        shuffle: visit the rows in an order drawn from ``seed`` (pass a new seed per epoch).
        drop_last: skip a last batch smaller than ``batch_size``.
        trim: cut the columns that hold only PAD in this batch (less work, but every batch may get a new
            shape, which makes compiled steps retrace: leave it off for Keras with ``jit_compile``).
    """
    src_ids, tgt_ids = np.asarray(src_ids), np.asarray(tgt_ids)
    if src_ids.ndim != 2 or tgt_ids.ndim != 2 or len(src_ids) != len(tgt_ids):
        raise ValueError(
            f"src_ids and tgt_ids must be (num_pairs, src_len) and (num_pairs, tgt_len) with the same num_pairs; "
            f"got {src_ids.shape} and {tgt_ids.shape}"
        )
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer; got {batch_size}")
    order = np.random.default_rng(seed).permutation(len(src_ids)) if shuffle else np.arange(len(src_ids))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        if drop_last and len(rows) < batch_size:
            return
        src, tgt = src_ids[rows], tgt_ids[rows]
        if trim:
            src = src[:, : max(1, int((src != pad_id).sum(axis=1).max()))]
            tgt = tgt[:, : max(2, int((tgt != pad_id).sum(axis=1).max()))]
        yield src, tgt
