"""Fill a dataclass from the command line: one flag per field, types checked by argparse."""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing


def add_dataclass_args(parser: argparse.ArgumentParser, cls, help_texts: dict[str, str] | None = None,
                       choices: dict[str, tuple] | None = None) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = (help_texts or {}).get(f.name, f.metadata.get("help", ""))
        help_text = f"{help_text} (default: {default})".strip()
        if f.metadata.get("positional"):  # a list of operands, e.g. run folders
            parser.add_argument(f.name, nargs="*", type=typing.get_args(kind)[0], default=default, help=help_text)
        elif kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=kind, default=default, help=help_text,
                                choices=(choices or {}).get(f.name, f.metadata.get("choices")))


def dataclass_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def _base_type(hint):
    """`int | None` -> int: an optional flag takes the same type as the field."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None))
    return hint


def parse_config(cls, description: str, argv=None):
    """The command line as a `cls` instance: help and choices from the fields' metadata, checks in its
    `__post_init__` (which raise a UserError that the caller's main prints)."""
    parser = argparse.ArgumentParser(description=description.strip().split("\n\n")[0])
    add_dataclass_args(parser, cls)
    return dataclass_from_args(cls, parser.parse_args(argv))
