"""``exportctl``: the operator's command line (typer + rich) and the notes importer.

A package of its own, beside the shared library ``exportcore``: none of the seven processes
(api, publisher, recovery-scanner, beat, fast/bulk workers, webhook-delivery) imports it, so
typer and rich are not loaded by them (tests/unit/test_process_imports.py checks that).
"""
