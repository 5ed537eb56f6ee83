"""Characters that change how text reads on a screen without being seen, defined once for
every place that shows text from users, files or the server: the operator console removes
them (``services/api/console/timeline.py``), ``exportctl`` prints them escaped
(``exportctl.common.safe``).

- the Unicode ``Bidi_Control`` characters (UAX #9, table 1): U+061C ARABIC LETTER MARK,
  U+200E/U+200F (LRM, RLM), U+202A to U+202E (LRE, RLE, PDF, LRO, RLO) and U+2066 to U+2069 (LRI,
  RLI, FSI, PDI). An override makes ``report\\u202etxt.exe`` show as ``reportexe.txt``: the
  "Trojan Source" attack, CVE-2021-42574;
- the zero-width characters U+200B to U+200D (space, non-joiner, joiner), which hide text
  inside a name or split a word so that two different names look the same.

Pure data: the console (a process) and exportctl (which no process may import) share it.
"""

from __future__ import annotations

INVISIBLE_FORMAT_CLASS = "\u061c\u200b-\u200f\u202a-\u202e\u2066-\u2069"
"""The characters above as the body of a regular-expression character class (``[...]``),
to be combined with each caller's own control-character ranges."""
