"""JSON and TOML from anything the project does not control (a request, a flag, a prompts line, a kept file, a
config file, a checkpoint, a dataset line): every way its parse can fail is one `Unparsable` with a one-line reason.

Python's parsers raise more than their own decode error: a RecursionError for arrays or tables nested deeper than
the interpreter's stack allows (`[[[...` 100,000 deep), and a plain ValueError whose advice (`use
sys.set_int_max_str_digits()`) is for programmers, for an integer of more than 4,300 digits.  Each caller turns
`Unparsable` into its own one line; none of them lists these cases itself.
"""
from __future__ import annotations

import json
import sys
import tomllib

from runtime.text import printable


class Unparsable(ValueError):
    """The text is not the JSON or TOML it should be; the message is one line saying why."""


def json_value(text: str | bytes):
    """The JSON value of `text` (bytes: UTF-8, as json.loads reads them)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise Unparsable(str(e)) from None
    except UnicodeDecodeError as e:
        raise Unparsable(f"not UTF-8 (byte {e.start})") from None
    except (RecursionError, ValueError) as e:
        raise Unparsable(_reason(e, "arrays and objects")) from None


def toml_table(data: bytes) -> dict:
    """The TOML table of the UTF-8 bytes `data`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Unparsable(f"not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise Unparsable(f"not valid TOML: {printable(str(e))}") from None
    except (RecursionError, ValueError) as e:
        raise Unparsable(_reason(e, "arrays and tables")) from None


def _reason(e: RecursionError | ValueError, nesting: str) -> str:
    """One line for an error the parser did not word for a user; `nesting` names what nests in the format."""
    if isinstance(e, RecursionError):
        return f"nested deeper than the parser can follow; {nesting} must not nest so deep"
    if "integer string conversion" in str(e):
        return f"holds an integer of more than {sys.get_int_max_str_digits()} digits"
    return printable(str(e).splitlines()[0] if str(e) else type(e).__name__)
