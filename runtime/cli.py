"""Fill a dataclass from the command line: one flag per field, types checked by argparse."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import operator
import signal
import sys
import types
import typing

from runtime.errors import UserError
from runtime.stopping import (Stopped, closing_line, ignore_stop_signals, stop_on_signals,
                              take_stop_noted_while_starting)

# The bounds `option` takes: how a message states each, and the test a value within it passes (NaN fails all).
_BOUNDS = {"min": ("at least", operator.ge), "above": ("above", operator.gt),
           "max": ("at most", operator.le), "below": ("below", operator.lt)}


def option(default, help_text: str, *, min=None, max=None, above=None, below=None, may_be_empty: bool = False,
           **metadata):
    """A config field whose help (and `choices`, `positional=True`, or `bare=VALUE`: the flag alone means
    VALUE, as `--resume` means `--resume yes`) the command line shows.  `min`/`max` (inclusive) and
    `above`/`below` (exclusive) bound its value, or each value of a list, which then holds at least one value
    unless `may_be_empty`; `check_options` enforces them."""
    bounds = {name: bound for name, bound in (("min", min), ("above", above), ("max", max), ("below", below))
              if bound is not None}
    metadata = {"help": help_text, **metadata, **({"bounds": bounds} if bounds else {}),
                **({"may_be_empty": True} if may_be_empty else {})}
    if isinstance(default, list):  # mutable: every instance gets its own copy
        return dataclasses.field(default_factory=lambda: list(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def flag(name: str) -> str:
    """The flag of a config field, as the user types it: batch_size -> --batch-size."""
    return "--" + name.replace("_", "-")


def check_options(config, error: type[Exception]) -> None:
    """For `__post_init__`: raise `error` (the tool's UserError) for the first field of the dataclass instance
    `config` outside its `option` bounds, in one form for every tool: `--batch-size must be at least 1, got 0`,
    or a bounded list left empty (`--batch-sizes needs at least one value`).  None passes: a field that may be
    None says "not given" or "none" with it, and bounds are for numbers."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if "bounds" not in f.metadata or value is None:
            continue
        if value == [] and not f.metadata.get("may_be_empty"):
            raise error(f"{flag(f.name)} needs at least one value")
        for item in value if isinstance(value, list) else [value]:
            for name, bound in f.metadata["bounds"].items():
                words, within = _BOUNDS[name]
                if not within(item, bound):
                    raise error(f"{flag(f.name)} must be {words} {bound}, got {item}")


def _describe_bounds(bounds: dict) -> str:
    return " and ".join(f"{_BOUNDS[name][0]} {bound}" for name, bound in bounds.items())


def add_dataclass_args(parser: argparse.ArgumentParser, cls, defaults: bool = True) -> None:
    """One flag per field; with `defaults=False` a flag not given leaves no attribute (see `given_fields`)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        name = flag(f.name)
        kind = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        notes = [_describe_bounds(f.metadata["bounds"])] if "bounds" in f.metadata else []
        if default is not None:  # None means "not given", which the help text explains
            notes.append(f"default: {default}")
        default = default if defaults else argparse.SUPPRESS
        help_text = f.metadata.get("help", "")
        if notes:
            help_text = f"{help_text} ({'; '.join(notes)})".strip()
        if f.metadata.get("positional"):  # a list of operands, e.g. run folders
            parser.add_argument(f.name, nargs="*", type=typing.get_args(kind)[0], default=default, help=help_text)
        elif kind is bool:
            parser.add_argument(name, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                                help=help_text)
        elif typing.get_origin(kind) is list:  # --modes ddp fsdp
            parser.add_argument(name, dest=f.name, nargs="+", type=typing.get_args(kind)[0], default=default,
                                help=help_text, choices=f.metadata.get("choices"))
        elif "bare" in f.metadata:
            parser.add_argument(name, dest=f.name, type=kind, default=default, help=help_text, nargs="?",
                                const=f.metadata["bare"], choices=f.metadata.get("choices"))
        else:
            parser.add_argument(name, dest=f.name, type=kind, default=default, help=help_text,
                                choices=f.metadata.get("choices"))


def dataclass_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def to_flags(options: dict) -> list[str]:
    """The command line that `add_dataclass_args` parses back into `options`:
    {"batch_size": 4, "compile": True, "modes": ["ddp", "tp"]} -> ["--batch-size", "4", "--compile",
    "--modes", "ddp", "tp"]; None values are left out."""
    out = []
    for key, value in options.items():
        if value is None:
            continue
        if isinstance(value, bool):
            out.append(flag(key) if value else "--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            out += [flag(key), *map(str, value)]
        else:
            out += [flag(key), str(value)]
    return out


def non_default_fields(config) -> list[str]:
    """The fields of the dataclass instance `config` that differ from its class's defaults, in field order.  The
    defaults are read field by field, not from an instance: a config with a required setting has none."""
    def default(f: dataclasses.Field):
        return f.default_factory() if f.default is dataclasses.MISSING else f.default
    return [f.name for f in dataclasses.fields(config) if getattr(config, f.name) != default(f)]


def non_default_flags(config) -> list[str]:
    """The flags that rebuild the dataclass instance `config` from its class's defaults (a field set to None
    where the default is not None cannot be written as a flag)."""
    return to_flags({name: getattr(config, name) for name in non_default_fields(config)})


def _base_type(hint):
    """`int | None` -> int: an optional flag takes the same type as the field."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None))
    return hint


def entry_point(main=None, *, interrupted: str | None = None):
    """Every command's `main(argv=None)` is wrapped by this, as `@entry_point` or `@entry_point(interrupted=...)`:
    a UserError ends the command with the one line `error: <message>` and exit status 1, while any other exception
    (a bug) keeps its traceback.  SIGINT and SIGTERM stop it however it was started (runtime/stopping.py) with one
    closing line, `stopped by SIGTERM <what it leaves>; exit status 143`, and exit status 128 + the signal's number,
    as a shell reports a command a signal ended.  What it leaves is what the stopped code said (`Stopped.saying`),
    else `interrupted`, the command's word for a stop anywhere."""
    def wrap(body):
        @functools.wraps(body)
        def command(argv=None):
            with stop_on_signals():
                try:
                    take_stop_noted_while_starting()
                    return body(argv)
                except UserError as e:
                    sys.exit(f"error: {e}")
                except KeyboardInterrupt as e:
                    stop = Stopped.of(e)
                    ignore_stop_signals()  # until the block ends: a repeated signal does not cut the line short
                    below_ctrl_c = "\n" if stop.signum == signal.SIGINT else ""  # a terminal shows ^C there
                    print(below_ctrl_c + closing_line(stop, interrupted), file=sys.stderr, flush=True)
                    raise SystemExit(stop.exit_status) from None
        return command
    return wrap if main is None else wrap(main)


class ToolParser(argparse.ArgumentParser):
    """argparse for every tool: a flag is spelled out (`--max-step 90` is refused, never taken as `--max-steps`),
    and a command line it cannot parse is one `error:` line, as the tools' other refusals are, with the nearest
    flag suggested, instead of the whole usage."""

    def __init__(self, **kwargs):
        super().__init__(allow_abbrev=False, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            self.error(self.unknown_message(unknown))
        return parsed

    def unknown_message(self, unknown: list[str]) -> str:
        flags = [word.partition("=")[0] for word in unknown if word.startswith("--")]
        if not flags:  # values with no flag to take them
            return f"unexpected argument{'s' if len(unknown) > 1 else ''} {' '.join(unknown)}"
        return "; ".join(f"unknown flag {name}{self.nearest(name)}" for name in flags)

    def nearest(self, name: str) -> str:
        known = [option for action in self._actions for option in action.option_strings if option.startswith("--")]
        close = difflib.get_close_matches(name, known, n=1)
        return f", did you mean {close[0]}?" if close else ""

    def _get_values(self, action, arg_strings):
        # argparse (3.11) drops the value of `--model=--` as if it were the end of the flags and hands the field an
        # empty list, which no field expects: refuse it as a flag given no value.
        if action.option_strings and arg_strings == ["--"]:
            self.error(f"argument {action.option_strings[0]}: expected a value, got --")
        return super()._get_values(action, arg_strings)

    def error(self, message: str):
        raise SystemExit(f"error: {printable(message)} (see `{self.prog} --help`)")


def printable(text: str) -> str:
    """`text` on one line: a character that does not print (a newline typed into an argument) as its escape."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _parser(cls, doc: str, epilog: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    summary, _, rest = doc.strip().partition("\n\n")
    parser = ToolParser(prog=prog, description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="\n\n".join(part for part in (rest, epilog) if part) or None)
    add_dataclass_args(parser, cls)
    return parser


def parse_config(cls, doc: str, argv=None, epilog: str | None = None, prog: str | None = None):
    """The command line as a `cls` instance: help and choices from the fields' metadata, checks in its
    `__post_init__` (which raise a UserError that the caller's main prints).  `doc` is the script's
    docstring: its first paragraph describes the command and the rest (its examples) follows the flags.
    `prog` names the command in its usage where the script's file name would not (`python -m serve`)."""
    return dataclass_from_args(cls, _parser(cls, doc, epilog, prog).parse_args(argv))


def given_fields(cls, argv=None) -> set[str]:
    """The fields the command line names, whatever their value: a default argparse filled in is not given."""
    parser = ToolParser()
    add_dataclass_args(parser, cls, defaults=False)
    return set(vars(parser.parse_args(argv)))
