"""The checks that keep the Chinese edition in step with the English sources (run by ``tests/test_catalogues.py``).

Three rules, each a function over gettext catalogues (Babel ``Catalog`` objects):

* :func:`completeness`: against a fresh extraction from today's English sources, a catalogue has no untranslated,
  fuzzy, obsolete or missing message. An English change therefore cannot land without its Chinese.
* :func:`terminology_problems`: the glossary (``book/glossary.md``) is the term base. Each entry is a group of term
  lines, English then Chinese, above an indented definition. A message whose English uses an entry's English term
  (whole words, any case, simple plurals; inline code, maths and link targets do not count) must use one of the
  entry's Chinese terms, unless a translator comment ``# glossary-exempt: word[, word]`` above the message names
  the term (the word is used in another sense: "the key idea", "the value of a parameter"). A longer term is matched
  before a shorter one inside it: "multi-head attention" asks for 多头注意力, not for 注意力 as well.
* :func:`markup_problems`: what the build needs kept exactly: MyST roles and their reference labels (a ``{term}``
  may show Chinese text as long as ``<label>`` keeps the English term), inline code, maths and link targets.

Two kinds of message are not the translators': the glossary's term lines (:func:`glossary_term_problems`: each is
translated as itself, so ``{term}`` references resolve in both editions) and the companion's docstrings on the API
page, which ``book/_ext/edition.py`` leaves out of the catalogue (the reference stays in English, like the code).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.pofile import read_po

EXEMPT = re.compile(r"glossary-exempt:\s*(?P<words>.+)")
CJK = re.compile(r"[\u3000-\u303f\u3400-\u9fff\uff00-\uffef]")
CODE = re.compile(r"``.+?``|`[^`]+`")
MATH = re.compile(r"\$\$.+?\$\$|\$[^$]+\$", re.S)
ROLE = re.compile(r"\{(?P<role>[a-z:-]+)\}`(?P<body>[^`]*)`")
LINK = re.compile(r"\]\(([^)]+)\)|<(https?://[^>]+)>|(https?://[^\s)>]+)")
LABEL = re.compile(r"<(?P<label>[^<>]+)>\s*$")


@dataclass(frozen=True)
class GlossaryEntry:
    """One glossary entry: its English term lines and its Chinese term lines (none for some, e.g. "dropout")."""

    english: tuple[str, ...]
    chinese: tuple[str, ...]


def load(path: Path) -> Catalog:
    """The catalogue (``.po`` or ``.pot``) at ``path``."""
    with path.open("rb") as handle:
        return read_po(handle)


def glossary_entries(glossary: str) -> list[GlossaryEntry]:
    """The entries of the ``{glossary}`` directive in the MyST text ``glossary``."""
    match = re.search(r"^```\{glossary\}\n(?P<body>.*?)^```", glossary, re.S | re.M)
    if not match:
        raise ValueError("glossary must hold a ```{glossary} directive")
    entries, terms = [], []
    for line in match["body"].splitlines():
        if not line.strip() or line.startswith(":"):
            continue
        if line[0].isspace():  # a definition line closes the group of term lines above it
            if terms:
                entries.append(GlossaryEntry(tuple(t for t in terms if not CJK.search(t)),
                                             tuple(t for t in terms if CJK.search(t))))
                terms = []
        else:
            terms.append(line.strip())
    return entries


def term_lines(entries: list[GlossaryEntry]) -> set[str]:
    """Every term line of the glossary, English and Chinese."""
    return {term for entry in entries for term in entry.english + entry.chinese}


def _english_prose(text: str) -> str:
    """``text`` with what is not English prose blanked out: inline code, maths, link targets, role labels."""
    text = ROLE.sub(lambda m: " " + LABEL.sub("", m["body"]) + " " if m["role"] == "term" else " ", text)
    text = CODE.sub(" ", MATH.sub(" ", text))
    return re.sub(r"\]\([^)]*\)", "] ", text)


def _term_pattern(term: str) -> re.Pattern:
    words = [re.escape(word) for word in re.split(r"[\s-]+", term)]
    return re.compile(r"(?<![\w-])" + r"[\s-]+".join(words) + r"(?:s|es)?(?![\w-])", re.I)


def exempt_words(message: Message) -> set[str]:
    """The words a ``# glossary-exempt: a, b`` translator comment of ``message`` names (lower case)."""
    words: set[str] = set()
    for comment in message.user_comments:
        match = EXEMPT.search(comment)
        if match:
            words |= {word.strip().lower() for word in match["words"].split(",") if word.strip()}
    return words


def terminology_problems(catalog: Catalog, entries: list[GlossaryEntry], skip: set[str] = frozenset()) -> list[str]:
    """For each translated message of ``catalog``: the glossary terms its English uses that its Chinese lacks."""
    ordered = sorted(((term, entry) for entry in entries for term in entry.english), key=lambda p: -len(p[0]))
    patterns = [(term, entry, _term_pattern(term)) for term, entry in ordered]
    problems = []
    for message in catalog:
        if not message.id or not message.string or message.id in skip:
            continue
        prose, exempt = _english_prose(message.id), exempt_words(message)
        for term, entry, pattern in patterns:
            found = pattern.search(prose)
            if not found:
                continue
            prose = pattern.sub(lambda m: " " * len(m[0]), prose)  # a shorter term inside this one is covered
            if not entry.chinese or term.lower() in exempt or found[0].lower() in exempt:
                continue
            if not any(chinese in message.string for chinese in entry.chinese):
                problems.append(f"{message.id[:60]!r}: '{term}' wants {' or '.join(entry.chinese)} "
                                f"(or a '# glossary-exempt: {term}' comment)")
    return problems


def _reference_labels(text: str) -> Counter:
    labels = Counter()
    for match in ROLE.finditer(text):
        body = match["body"]
        label = LABEL.search(body)
        if match["role"] == "term" and not label:
            continue  # {term}`text` names its entry by its text: only the role is counted
        labels[(match["role"], (label["label"] if label else body).strip())] += 1
    return labels


def markup_problems(message_id: str, translation: str) -> list[str]:
    """What ``translation`` lost or changed of the markup of ``message_id``."""
    problems = []
    roles_before = Counter(m["role"] for m in ROLE.finditer(message_id))
    roles_after = Counter(m["role"] for m in ROLE.finditer(translation))
    if roles_before != roles_after:
        problems.append(f"roles {dict(roles_before)} -> {dict(roles_after)}")
    lost = _reference_labels(message_id) - _reference_labels(translation)
    if lost:
        problems.append(f"reference labels lost: {sorted(lost)}")
    term_ids = Counter(m["body"] for m in ROLE.finditer(message_id)
                       if m["role"] == "term" and not LABEL.search(m["body"]))
    for body, count in term_ids.items():  # {term}`mask` -> {term}`mask` or {term}`掩码 <mask>`
        kept = sum(1 for m in ROLE.finditer(translation) if m["role"] == "term" and
                   (m["body"] == body or (LABEL.search(m["body"]) and LABEL.search(m["body"])["label"] == body)))
        if kept < count:
            problems.append(f"{{term}}`{body}` lost its label")
    without_roles = [ROLE.sub(" ", text) for text in (message_id, translation)]
    code = [Counter(CODE.findall(text)) for text in without_roles]
    if code[0] != code[1]:
        problems.append(f"inline code differs: {sorted((code[0] - code[1]).elements())[:3]} missing")
    math = [Counter(MATH.findall(CODE.sub(" ", text))) for text in without_roles]
    if math[0] != math[1]:
        problems.append(f"maths differs: {sorted((math[0] - math[1]).elements())[:3]} missing")
    links = [Counter(next(g for g in m if g) for m in LINK.findall(text)) for text in (message_id, translation)]
    if links[0] != links[1]:
        problems.append(f"link targets differ: {sorted((links[0] - links[1]).elements())[:3]} missing")
    starts = [line.lstrip()[:3] for line in translation.splitlines()[1:]]
    if any(start in ("---", "===", "***") for start in starts):  # MyST-Parser#657: read as a rule or a heading
        problems.append("a line of the translation starts with ---, === or ***: write it on the line before")
    return problems


def catalogue_markup_problems(catalog: Catalog) -> list[str]:
    """:func:`markup_problems` for every translated message of ``catalog``."""
    return [f"{m.id[:60]!r}: {problem}" for m in catalog if m.id and m.string
            for problem in markup_problems(m.id, m.string)]


def glossary_term_problems(catalog: Catalog, entries: list[GlossaryEntry]) -> list[str]:
    """Term lines of the glossary page translated as anything but themselves (``{term}`` references would break)."""
    lines = term_lines(entries)
    return [f"term line {m.id!r} translated as {m.string!r}" for m in catalog
            if m.id in lines and m.string and m.string != m.id]


@dataclass(frozen=True)
class Completeness:
    """The state of one catalogue against a fresh template of its page."""

    total: int
    untranslated: int
    fuzzy: int
    obsolete: int
    missing: int

    @property
    def complete(self) -> bool:
        return not (self.untranslated or self.fuzzy or self.obsolete or self.missing)

    def __str__(self) -> str:
        return (f"{self.total} messages, {self.untranslated} untranslated, {self.fuzzy} fuzzy, "
                f"{self.obsolete} obsolete, {self.missing} missing")


def completeness(catalog: Catalog, template_ids: set[str]) -> Completeness:
    """Count what keeps ``catalog`` from matching the template whose message ids are ``template_ids``."""
    messages = {m.id: m for m in catalog if m.id}
    current = [messages[i] for i in template_ids if i in messages]
    obsolete = len(catalog.obsolete) + sum(1 for i in messages if i not in template_ids)
    return Completeness(
        total=len(template_ids),
        untranslated=sum(1 for m in current if not m.string),
        fuzzy=sum(1 for m in current if m.string and m.fuzzy),
        obsolete=obsolete,
        missing=sum(1 for i in template_ids if i not in messages),
    )
