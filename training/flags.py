"""One command-line flag per field of a frozen settings dataclass, for every training entry point.

`--some-field` for `some_field`; booleans are switches (`--no-x` when the default is on), tuples take several
values, Literals become choices, `X | None` takes an X; each flag's help is the reason for its default. A settings
class that rejects a combination (ValueError in __post_init__) is reported as a command-line error.
"""
from __future__ import annotations

import argparse
import dataclasses
import types
import typing

from selfspec.loading import portable_name


def parse_settings(settings_class, help_texts: dict[str, str], argv: list[str] | None = None, description: str = "",
                   epilog: str | None = None):
    parser = argparse.ArgumentParser(description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    hints = typing.get_type_hints(settings_class)
    for field in dataclasses.fields(settings_class):
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `float | None`: a float flag, default None
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        options: dict = {"help": help_texts.get(field.name, "")}
        if field.default is dataclasses.MISSING:
            options["required"] = True
        else:
            options["default"] = field.default
        if kind is bool:
            action = argparse.BooleanOptionalAction if field.default else "store_true"
            parser.add_argument(flag, action=action, **options)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag, nargs="+", metavar="PATH", **options)
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(kind), **options)
        else:
            parser.add_argument(flag, type=kind, **options)
    args = vars(parser.parse_args(argv))
    try:
        return settings_class(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    except ValueError as err:
        parser.error(str(err))


def settings_record(settings) -> dict:
    """The settings as a run's train_settings.json and log record them, each absolute path by its last component
    (`portable_name`): they ship beside the checkpoint, and must name no folder of the machine that trained it."""
    return portable_record(dataclasses.asdict(settings))


def portable_record(value):
    """`value` (JSON-like: dicts, lists, strings, numbers) with every string passed through `portable_name`."""
    if isinstance(value, dict):
        return {key: portable_record(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable_record(item) for item in value]
    return portable_name(value) if isinstance(value, str) else value
