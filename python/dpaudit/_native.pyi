"""Stub of the compiled core (use the typed `dpaudit` API instead)."""

__version__: str

def call(op: str, request: str) -> str:
    """Runs one operation (`validate`, `from_value`, `load`, `account`, `check`, `calibrate`,
    `analyze`) on a JSON request and returns the JSON answer. Invalid input raises ValueError
    with args (message, field, file, line)."""
    ...
