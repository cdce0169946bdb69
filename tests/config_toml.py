"""Writing TOML for the tests of `--config` (Python reads TOML with tomllib but writes none): a value as a TOML
literal, and a settings file from a dict of keys."""
from __future__ import annotations

import json
import math
from pathlib import Path


def literal(value) -> str:
    """`value` (bool, int, float, str, Path or a list of them) as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("-" if value < 0 else "") + "inf" if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(literal, value)) + "]"
    return json.dumps(str(value))  # a JSON string is a TOML basic string for every printable character


def write_toml(path: Path, settings: dict) -> Path:
    """A config file holding `settings` ({"batch-size": 4, ...}); keys are quoted so that any text is a key."""
    path.write_text("".join(f"{json.dumps(key)} = {literal(value)}\n" for key, value in settings.items()))
    return path
