"""A schedule's rule in words (cron-descriptor): ``0 2 * * *`` reads "At 02:00", so schedule
lists (``GET /v1/schedules``, the console) say what a rule means, not only how it is
written."""

from __future__ import annotations

from functools import lru_cache

from cron_descriptor import FormatException, Options, get_description

from exportcore.schedules.rules import NICKNAMES

_OPTIONS = Options()
_OPTIONS.use_24hour_time_format = True
_OPTIONS.verbose = False


@lru_cache(maxsize=1024)
def describe(cron: str | None, timezone: str | None = None, every: int | None = None) -> str:
    """``cron`` in words with its zone ("At 02:00, Monday through Friday (Europe/Berlin)"),
    an interval as "Every N seconds", or "" when the expression cannot be described (the
    rule itself was validated when it was saved; nicknames such as ``@daily`` are described
    through their five fields, :data:`exportcore.schedules.rules.NICKNAMES`)."""
    if cron is None:
        return f"Every {every} seconds" if every else ""
    expression = NICKNAMES.get(cron.strip(), cron)
    try:
        words = get_description(expression, _OPTIONS)
    except (FormatException, ValueError, KeyError, IndexError):
        return ""
    return f"{words} ({timezone})" if timezone else words
