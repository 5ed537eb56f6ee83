"""The webhook-delivery process (``python -m services.webhook_delivery``).

httpx 0.28 imports its own command-line client (``httpx._main``: rich, click, pygments)
from ``httpx/__init__.py`` whenever those are installed (encode/httpx#3547), and the image
has rich for ``exportctl``. This process sends webhooks with httpcore (the engine under
httpx, for the attempt deadline) and does not import httpx itself; should a library do so,
the module is marked absent before httpx loads: ``import httpx`` then takes httpx's own
``ImportError`` fallback for ``httpx.main``, and the process loads neither rich nor pygments
(about 0.5 s of start-up; tests/unit/test_process_imports.py checks it).
"""

import sys
from types import ModuleType
from typing import cast

# The import system's documented sentinel (a None entry raises ImportError on import), which
# typeshed's dict[str, ModuleType] does not spell.
cast("dict[str, ModuleType | None]", sys.modules).setdefault("httpx._main", None)
