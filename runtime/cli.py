"""Fill a dataclass from the command line, and from a TOML file named by `--config`: one flag (and one key) per
field, types and bounds checked; flags on the command line override the file."""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import operator
import signal
import sys
import types
import typing
from pathlib import Path

from runtime.errors import UserError
from runtime.parsed import Unparsable, toml_table
from runtime.stopping import (Stopped, closing_line, ignore_stop_signals, stop_on_signals,
                              take_stop_noted_while_starting)
from runtime.text import printable

# The bounds `option` takes: how a message states each, and the test a value within it passes (NaN fails all).
_BOUNDS = {"min": ("at least", operator.ge), "above": ("above", operator.gt),
           "max": ("at most", operator.le), "below": ("below", operator.lt)}


def option(default, help_text: str, *, min=None, max=None, above=None, below=None, may_be_empty: bool = False,
           **metadata):
    """A config field whose help (and `choices`, `positional=True`, or `bare=VALUE`: the flag alone means
    VALUE, as `--resume` means `--resume yes`) the command line shows.  `min`/`max` (inclusive) and
    `above`/`below` (exclusive) bound its value, or each value of a list; a list so bounded, or with `choices`,
    holds at least one value unless `may_be_empty`.  `check_options` enforces them."""
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
    or a bounded or choice list left empty (`--batch-sizes needs at least one value`).  None passes: a field that
    may be None says "not given" or "none" with it, and bounds are for numbers."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if not {"bounds", "choices"} & f.metadata.keys() or value is None:
            continue
        if value == [] and not f.metadata.get("may_be_empty"):
            raise error(f"{flag(f.name)} needs at least one value")
        problem = _outside_bounds(value, f.metadata.get("bounds", {}))
        if problem:
            raise error(f"{flag(f.name)} {problem}")


def _outside_bounds(value, bounds: dict) -> str | None:
    """What is wrong with `value` (a number, or a list of them) under an `option`'s bounds, or None."""
    for item in value if isinstance(value, list) else [value]:
        for name, bound in bounds.items():
            words, within = _BOUNDS[name]
            if not within(item, bound):
                return f"must be {words} {bound}, got {item}"
    return None


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
                    result = body(argv)
                except UserError as e:
                    sys.exit(f"error: {e}")
                except KeyboardInterrupt as e:
                    stop = Stopped.of(e)
                    ignore_stop_signals()  # until the block ends: a repeated signal does not cut the line short
                    below_ctrl_c = "\n" if stop.signum == signal.SIGINT else ""  # a terminal shows ^C there
                    print(below_ctrl_c + closing_line(stop, interrupted), file=sys.stderr, flush=True)
                    raise SystemExit(stop.exit_status) from None
            if argv is None:
                # The process's own command has finished: a stop from here on has nothing left to stop, and the
                # interpreter's exit puts a Python handler back to the default, which would end it by the signal
                # instead of with status 0.  (A caller passing argv keeps its handlers.)
                ignore_stop_signals()
            return result
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


CONFIG_FLAG = "--config"
CONFIG_HELP = ("read settings from a TOML file: each key is a flag without its leading dashes, with dashes or "
               "underscores (batch-size = 16 or batch_size = 16, compile = true, modes = [\"ddp\", \"tp\"]); a flag "
               "given on the command line overrides the file")


class ConfigFileError(UserError):
    """A `--config` file that cannot be read, or a key in it that is unknown, of the wrong type or out of bounds."""


def _parser(cls, doc: str, epilog: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    summary, _, rest = doc.strip().partition("\n\n")
    parser = ToolParser(prog=prog, description=summary, formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog="\n\n".join(part for part in (rest, epilog) if part) or None)
    add_dataclass_args(parser, cls)
    parser.add_argument(CONFIG_FLAG, metavar="FILE.toml", type=Path, help=CONFIG_HELP)
    return parser


def parse_config(cls, doc: str, argv=None, epilog: str | None = None, prog: str | None = None):
    """The command line (and the `--config` file it names) as a `cls` instance: help and choices from the fields'
    metadata, checks in its `__post_init__` (which raise a UserError that the caller's main prints).  `doc` is the
    script's docstring: its first paragraph describes the command and the rest (its examples) follows the flags.
    `prog` names the command in its usage where the script's file name would not (`python -m serve`)."""
    parser = _parser(cls, doc, epilog, prog)
    args = parser.parse_args(argv)
    if args.config is None:
        return dataclass_from_args(cls, args)
    from_file = read_config_file(cls, args.config)
    parser.set_defaults(**from_file)  # the file's values stand where the defaults stood: a flag still wins
    args = parser.parse_args(argv)
    try:
        return dataclass_from_args(cls, args)
    except UserError as e:  # a check across settings: say which of them the file set
        named = [key for key in from_file if flag(key) in str(e) and key not in given_on_command_line(cls, argv)]
        if not named:
            raise
        raise ConfigFileError(f"{e} ({flag(named[0])[2:]} is set in {args.config})") from e


def given_on_command_line(cls, argv=None) -> set[str]:
    """The fields the command line itself names, whatever their value: a default argparse filled in is not given."""
    parser = ToolParser()
    add_dataclass_args(parser, cls, defaults=False)
    parser.add_argument(CONFIG_FLAG, type=Path, default=argparse.SUPPRESS)
    return set(vars(parser.parse_args(argv))) - {"config"}


def given_fields(cls, argv=None) -> set[str]:
    """The fields the user set, on the command line or as a key of its `--config` file."""
    parser = ToolParser()
    parser.add_argument(CONFIG_FLAG, type=Path)
    config, _ = parser.parse_known_args(argv)
    in_file = set(read_config_file(cls, config.config)) if config.config is not None else set()
    return given_on_command_line(cls, argv) | in_file


def read_config_file(cls, path: Path) -> dict:
    """The settings of the TOML file at `path` for the dataclass `cls`, by field name, each checked as its flag
    would be (type, choices, bounds).  Anything wrong is one ConfigFileError naming the file and the key."""
    if path.is_dir():
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: is a folder; name a .toml file")
    if path.exists() and not path.is_file():  # a FIFO or a device would block the read or never end it
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: not a regular file; name a .toml file")
    try:
        table = toml_table(path.read_bytes())
    except FileNotFoundError:
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: no such file") from None
    except OSError as e:
        raise ConfigFileError(f"{CONFIG_FLAG} {path}: cannot be read ({e.strerror})") from None
    except Unparsable as e:
        raise ConfigFileError(f"{path}: {e}") from None
    fields = {f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    settings, spelt = {}, {}
    for key, value in table.items():
        # `max_steps` and `max-steps` name one key: the flags' spelling, and the one nanoGPT's, torchtitan's and
        # Hugging Face's config files use.  Unknown, either is refused with the flag's spelling suggested.
        dashed = key.replace("_", "-")
        if dashed not in fields:
            close = difflib.get_close_matches(dashed, list(fields), n=1)
            hint = f", did you mean {close[0]}?" if close else f"; {cls.__name__}'s keys are the flags of --help"
            raise ConfigFileError(f"{path}: unknown key {printable(key)!r}{hint}")
        if dashed in spelt:
            raise ConfigFileError(f"{path}: {printable(spelt[dashed])!r} and {printable(key)!r} set the same key; "
                                  f"keep one")
        spelt[dashed] = key
        field = fields[dashed]
        problem, converted = _config_value(_base_type(hints[field.name]), value, field.metadata)
        if problem:
            raise ConfigFileError(f"{path}: {key} {problem}")
        settings[field.name] = converted
    return settings


def _config_value(kind, value, metadata) -> tuple[str | None, object]:
    """(what is wrong, None) or (None, the value as the field takes it) for one key of a config file."""
    if typing.get_origin(kind) is list:
        if not isinstance(value, list):
            return f"must be a list, got {_shown(value)}", None
        if not value and not metadata.get("may_be_empty"):
            return "needs at least one value", None
        items = [_config_value(typing.get_args(kind)[0], item, {"choices": metadata.get("choices")}) for item in value]
        problem = next((problem for problem, _ in items if problem), None)
        return (problem, None) if problem else _checked([item for _, item in items], metadata)
    if kind is bool:
        return (None, value) if isinstance(value, bool) else (f"must be true or false, got {_shown(value)}", None)
    if isinstance(value, bool) or isinstance(value, (dict, list)):
        return f"must be {_TYPE_WORDS.get(kind, 'a string')}, got {_shown(value)}", None
    if kind is int:
        return _checked(value, metadata) if isinstance(value, int) else (f"must be an integer, got {_shown(value)}",
                                                                           None)
    if kind is float:
        if not isinstance(value, (int, float)):
            return f"must be a number, got {_shown(value)}", None
        return _checked(float(value), metadata)
    if not isinstance(value, str):
        return f"must be a string, got {_shown(value)}", None
    if "\0" in value:  # TOML can write one ("\u0000"), a command line cannot, and no path or name holds one
        return "holds a NUL character (\\u0000), which no flag can carry; remove it", None
    try:
        return _checked(kind(value), metadata)
    except (TypeError, ValueError) as e:
        return f"is not a valid value: {printable(str(e))}", None


_TYPE_WORDS = {int: "an integer", float: "a number", str: "a string", Path: "a path (a string)"}


def _checked(value, metadata) -> tuple[str | None, object]:
    choices = metadata.get("choices")
    items = value if isinstance(value, list) else [value]
    if choices is not None:
        wrong = next((item for item in items if item not in choices), None)
        if wrong is not None:
            return f"must be one of {', '.join(map(str, choices))}, got {_shown(wrong)}", None
    problem = _outside_bounds(value, metadata["bounds"]) if "bounds" in metadata else None
    return (problem, None) if problem else (None, value)


def _shown(value) -> str:
    """A value as the file spells it (`"16"` for a string, `[1, 2]`, `true`), on one line and cut short."""
    text = printable(json.dumps(value, ensure_ascii=False, default=str))
    return text if len(text) <= 60 else text[:57] + "..."
