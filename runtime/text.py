"""Bytes from a file or a pipe as text, or one error that says where the first byte that is not UTF-8 is; any text
on one line."""
from __future__ import annotations

from runtime.errors import UserError


def decode_utf8(data: bytes, source: object, fix: str, error: type[UserError]) -> str:
    """UTF-8 text with newlines as text mode reads them (so tokens match a file opened in text mode); a bad
    byte raises `error` naming `source`, the byte, its offset and line, and `fix`."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(f"{source} is not UTF-8: byte 0x{data[e.start]:02x} at offset {e.start} (line {line}); "
                    f"{fix}") from e
    return text.replace("\r\n", "\n").replace("\r", "\n")


def printable(text: str) -> str:
    """`text` on one line: a character that does not print (a newline typed into an argument) as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
