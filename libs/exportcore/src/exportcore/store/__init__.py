"""Typed wrappers around the named SQL statements, one module per aggregate.

Each function takes an open connection (the caller owns the transaction), runs exactly one
statement and returns the row(s) it produced; ``None`` means a guarded transition was refused.
"""
