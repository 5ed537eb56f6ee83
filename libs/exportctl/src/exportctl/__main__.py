"""``python -m exportctl``: the same command line as the ``exportctl`` console script."""

from __future__ import annotations

from exportctl.main import app

if __name__ == "__main__":
    app()
