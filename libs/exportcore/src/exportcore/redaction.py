"""What a secret looks like, written once for every place that shows text to people: the
log filter (:mod:`exportcore.logs`, mask ``***``) and the operator console's error details
(``services/api/console/timeline.py``, mask ``[redacted]``). A pattern added here is masked
in both.

The rules, in the order they run:

- credentials in a URL (``scheme://user:pass@`` and ``scheme://user@``);
- API keys (``nex_…``; exportcore.auth), before the bearer rule so that a key sent as a
  bearer token keeps its ``nex_`` prefix and tells the reader what kind of secret it was;
- bearer tokens (``Bearer …``, RFC 6750 section 2.1's ``b64token``);
- ``key=value`` / ``key: value`` pairs whose key names a secret (password, secret, token,
  API or access key, authorization), quoted values whole;
- AWS access key ids (``AKIA…`` / ``ASIA…``, 20 characters);
- PostgreSQL's row content (``DETAIL:`` lines, ``Failing row contains (…)``,
  ``Key (…)=(…)``), which psycopg puts on lines of its own in ``str(exc)``.
"""

from __future__ import annotations

import functools
import re

_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)[^\s/@:]*(:[^\s/@]*)?@", re.IGNORECASE),
        r"\g<scheme>{mask}@",
    ),
    (re.compile(r"\bnex_[A-Za-z0-9_-]{8,}"), "nex_{mask}"),
    (re.compile(r"(?i)\bBearer\s+(?!nex_)[A-Za-z0-9._~+/\-]+=*"), "Bearer {mask}"),
    (
        re.compile(
            r"(?i)\b(password|passwd|pwd|secret|token|api[_-]?key|access[_-]?key|"
            r"secret[_-]?access[_-]?key|authorization)(\s*[=:]\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&]+)"
        ),
        r"\1\2{mask}",
    ),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "{mask}"),
    (re.compile(r"^([ \t]*)DETAIL:.*$", re.MULTILINE), r"\1DETAIL: {mask}"),
    (re.compile(r"Failing row contains .*$", re.MULTILINE), "Failing row contains {mask}"),
    (re.compile(r"\bKey \(([^)\n]*)\)=\(.*$", re.MULTILINE), r"Key (\1)=({mask})"),
)

# What any match of a rule contains: a string without one of these needs no rule run (the
# common case, an id or a route), which keeps the log filter cheap on every written line.
_MARKERS = re.compile(
    r"://|nex_|DETAIL|Failing row|Key \(|AKIA|ASIA"
    r"|(?i:bearer|passw|pwd|secret|token|api[_-]?key|access[_-]?key|authorization)"
)

LOG_MASK = "***"
"""What the log filter writes in place of a secret."""


@functools.cache
def _rules(mask: str) -> tuple[tuple[re.Pattern[str], str], ...]:
    """The rules with ``mask`` in their replacements (escaped for ``re.sub``)."""
    literal = mask.replace("\\", "\\\\")
    return tuple((pattern, repl.replace("{mask}", literal)) for pattern, repl in _RULES)


def redact(text: str, mask: str = LOG_MASK) -> str:
    """``text`` with every secret the module's rules describe replaced by ``mask`` (URL
    credentials, API keys, bearer tokens, secret ``key=value`` pairs, AWS access key ids,
    PostgreSQL's row content). A string with nothing to mask is returned as it is (the same
    object)."""
    if _MARKERS.search(text) is None:
        return text
    for pattern, repl in _rules(mask):
        text = pattern.sub(repl, text)
    return text
