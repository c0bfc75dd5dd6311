"""The external-content envelope around an untrusted result, which the content cannot close.

The spec's markers keep their names and gain a per-result random id::

    <<<EXTERNAL_UNTRUSTED_CONTENT id="3f9a0c4e1b2d7a65">>>
    ...
    <<<END_EXTERNAL_UNTRUSTED_CONTENT id="3f9a0c4e1b2d7a65">>>

Two defences, because a model reading the result may not compare ids:

1. The id is drawn after the script finished, so its output cannot contain the real end marker.
2. Anything in the content that spells the marker words is replaced, as the direct webfetch
   tool does, with ``[[MARKER_SANITIZED]]`` / ``[[END_MARKER_SANITIZED]]``. "Spells" is
   generous: any case, any punctuation or spacing between the words (``<<< end external
   untrusted-content >>>``), zero-width and other invisible format characters, combining marks,
   fullwidth forms and Cyrillic/Greek look-alike letters. Text that merely mentions the phrase
   "external untrusted content" is replaced too: the envelope is worth more than that phrase.
"""

from __future__ import annotations

import re
import secrets
import unicodedata

__all__ = [
    "END_MARKER",
    "START_MARKER",
    "neutralize_markers",
    "parse_envelope",
    "wrap_untrusted",
]

START_MARKER = "<<<EXTERNAL_UNTRUSTED_CONTENT"
END_MARKER = "<<<END_EXTERNAL_UNTRUSTED_CONTENT"
SANITIZED = "[[MARKER_SANITIZED]]"
END_SANITIZED = "[[END_MARKER_SANITIZED]]"

# Letters that look like the ASCII letters of the marker words (Cyrillic, Greek, Armenian),
# by their lower-case form: folding casefolds first, so capitals land here too.
_LOOKALIKES = {
    "a": "\u0430\u03b1",
    "c": "\u0441\u03f2",
    "d": "\u0501",
    "e": "\u0435\u03b5\u04bd",
    "i": "\u0456\u03b9",
    "l": "\u04cf",
    "n": "\u043f\u03b7\u03bd",  # \u03bd: the casefold of Greek capital Nu
    "o": "\u043e\u03bf\u03c3",
    "r": "\u0433\u1d26",
    "s": "\u0455",
    "t": "\u0442\u03c4",
    "u": "\u03c5\u057d",
    "x": "\u0445\u03c7",
}
_LOOKALIKE_OF = {ch: ascii_ for ascii_, chars in _LOOKALIKES.items() for ch in chars}

_SEP = r"[\W_]*"
_MARKER = re.compile(
    # Leading runs are bounded: search() tries every start, and an unbounded run there
    # would make a page of punctuation or spaces quadratic.
    r"[^\w\s]{0,8}\s{0,8}"  # the opening <<< (or any look-alike punctuation)
    rf"(?P<end>end{_SEP})?external{_SEP}untrusted{_SEP}content"
    r"(?:\s*id\s*=\s*[\"']?[\w-]*[\"']?)?"  # a forged id attribute
    r"(?:\s{0,8}[^\w\s]+)?",  # the closing >>>
)

# Cache bound for folded non-ASCII characters: a page can hold many distinct code points.
_CACHE_LIMIT = 65_536


class _FoldTable(dict[int, str]):
    """``str.translate`` table: each character to its folded form (computed once, cached)."""

    def __missing__(self, code: int) -> str:
        folded = _fold(chr(code))
        if len(self) < _CACHE_LIMIT:
            self[code] = folded
        return folded


def _fold(ch: str) -> str:
    if ch.isascii():
        return ch.lower()
    if unicodedata.category(ch) in ("Cf", "Mn", "Me"):
        return ""  # zero-width, bidi controls, combining marks: invisible to a reader
    decomposed = unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", ch).casefold())
    return "".join(_LOOKALIKE_OF.get(c, c) for c in decomposed if not unicodedata.combining(c))


_TABLE = _FoldTable()


def neutralize_markers(content: str) -> str:
    """``content`` with every envelope-marker look-alike replaced (see the module doc)."""
    folded = content.translate(_TABLE)
    if _MARKER.search(folded) is None:
        return content  # the common case: one C-speed pass, no copy
    # Map each folded character back to the original character it came from (ASCII folds
    # one to one).
    origin: range | list[int] = range(len(content))
    if not content.isascii():
        origin = []
        for index, ch in enumerate(content):
            origin.extend([index] * len(ch.translate(_TABLE)))
    pieces: list[str] = []
    cursor = 0
    for match in _MARKER.finditer(folded):
        start, stop = origin[match.start()], origin[match.end() - 1] + 1
        pieces.append(content[cursor:start])
        pieces.append(END_SANITIZED if match.group("end") else SANITIZED)
        cursor = stop
    pieces.append(content[cursor:])
    return "".join(pieces)


def wrap_untrusted(content: str, notice: str, *, nonce: str | None = None) -> str:
    """``content`` inside the envelope: open marker, ``notice``, the neutralized content, end."""
    nonce = nonce or secrets.token_hex(8)
    return (
        f'{START_MARKER} id="{nonce}">>>\n{notice}\n\n'
        f'{neutralize_markers(content)}\n\n{END_MARKER} id="{nonce}">>>'
    )


_ENVELOPE = re.compile(
    re.escape(START_MARKER)
    + r' id="(?P<id>[0-9a-f]+)">>>\n(?P<inner>.*)\n\n'
    + re.escape(END_MARKER)
    + r' id="(?P=id)">>>',
    re.DOTALL,
)


def parse_envelope(content: str) -> tuple[str, str] | None:
    """``(id, inner)`` when ``content`` is one whole envelope, else None.

    ``inner`` is the notice line, a blank line and the (neutralized) content.
    """
    match = _ENVELOPE.fullmatch(content)
    return None if match is None else (match.group("id"), match.group("inner"))
