"""Dataclasses to JSON and back, checked against their type hints, so that a result read from disk is the
same typed object the experiment returned and a file of another shape is refused by name."""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from runtime.errors import UserError

T = TypeVar("T")


class ResultShapeError(UserError):
    """A results file that does not have the shape its experiment's result type declares."""


def to_json(value: Any) -> Any:
    """Plain JSON values: dataclasses become dicts (recursively, through lists and dicts)."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def from_json(cls: type[T], data: Any, where: str = "result") -> T:
    """`data` (parsed JSON) as an instance of `cls`; `where` names the place in errors."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if cls is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return from_json(options[0], data, where)
        for option in options:  # e.g. int | str: the first that fits
            try:
                return from_json(option, data, where)
            except ResultShapeError:
                continue
        raise ResultShapeError(f"{where}: {data!r} is none of {cls}")
    if origin is list:
        _expect(data, list, where)
        return [from_json(args[0], item, f"{where}[{i}]") for i, item in enumerate(data)]
    if origin is dict:
        _expect(data, dict, where)
        return {key: from_json(args[1], item, f"{where}.{key}") for key, item in data.items()}
    if dataclasses.is_dataclass(cls):
        return _dataclass_from_json(cls, data, where)
    if cls is float:
        _expect(data, (int, float), where)
        return float(data)
    _expect(data, cls, where)
    return data


def _dataclass_from_json(cls, data, where: str):
    _expect(data, dict, where)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ResultShapeError(f"{where}: {cls.__name__} has no field(s) {sorted(unknown)}")
    values = {}
    for name, f in fields.items():
        if name in data:
            values[name] = from_json(hints[name], data[name], f"{where}.{name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ResultShapeError(f"{where}: {cls.__name__} needs the field {name!r}")
    return cls(**values)


def _expect(data, kind, where: str) -> None:
    # bool is an int to isinstance, but a count of True is no count.
    if not isinstance(data, kind) or (isinstance(data, bool) and kind in (int, (int, float))):
        expected = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise ResultShapeError(f"{where}: expected {expected}, found {type(data).__name__} {data!r:.60}")
