"""``docs/configuration.md``, generated from the schemas and ``conf/``:
``python -m rlexp.compose.config_doc > docs/configuration.md`` (a test fails when the committed file differs);
``--plugins``: with the options of the installed plugins (``rlexp.compose.plugins``) too."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import OmegaConf

from rlexp.compose.registry import CODE_OPTIONS, CONF_DIR, DOC, SCHEMAS, format_default, group_options
from rlexp.config.schema import Config, field_help

INTRO = """\
Pick an option of a group with `group=option`, set a key with `key=value` (`group.key=value` inside a
group or block), apply a preset with `+experiment=name`, sweep with `-m` and comma-separated values:

```
python -m rlexp.train algo=ppo activation=tanh init=orthogonal optimizer.lr=3e-4
python -m rlexp.train -m activation=relu,tanh clipping=none,global_norm
python -m rlexp.train +experiment=seed_critic clipping=none
```

Every option of a group carries all of the group's keys; options differ only in their defaults, and a
key an option does not read is ignored (each key's meaning names the options that read it). So a
preset's settings never lock its groups. Each default is written once, in `rlexp/config/schema.py`; an option
that deliberately differs says so below. `python -m rlexp.train --help` prints a short version."""


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _key_table(schema: type, instance: Any, prefix: str, skip: Collection[str] = ()) -> list[str]:
    """key | default | meaning, for every scalar key of ``schema`` but those in ``skip`` (nested blocks
    recursively)."""
    lines = [_row(["key", "default", "meaning"]), _row(["---"] * 3)]
    nested = []
    for f in fields(schema):
        if f.name in skip:
            continue
        value = getattr(instance, f.name)
        if is_dataclass(value):
            nested.append((f.name, value))
        else:
            lines.append(_row([f"`{prefix}{f.name}`", f"`{format_default(value)}`", field_help(schema, f.name)]))
    for name, value in nested:
        lines += [_row([f"`{prefix}{name}.*`", "", field_help(schema, name)])]
        lines += _key_table(type(value), value, f"{prefix}{name}.")[2:]
    return lines


def _comment(path: Path) -> str:
    """A yaml's leading comment (after ``# @package``, up to a command line): what the option or preset is."""
    words = []
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("# ") or line[2:].strip().startswith("python "):
            break
        words.append(line[2:].strip())
    return " ".join(words)


def _default_options() -> dict[str, str]:
    """group -> the option conf/config.yaml picks."""
    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml").defaults)
    return {k: str(v) for e in entries if isinstance(e, dict) for k, v in e.items() if k in SCHEMAS}


def _what(group: str, option: str) -> str:
    """What an option is: its yaml's comment, or for one registered from code its doc and who registered it."""
    code = CODE_OPTIONS.get(group, {}).get(option)
    return f"{code.doc} (plugin {code.source})" if code else _comment(CONF_DIR / group / f"{option}.yaml")


def _group(group: str, base: type, default: str, code: bool) -> list[str]:
    lines = [
        f"### `{group}` (default `{default}`)",
        "",
        base.__doc__ or "",
        "",
        _row(["option", "what it is", "schema", "defaults that differ"]),
        _row(["---"] * 4),
    ]
    schemas = SCHEMAS[group]
    base_defaults = {f.name: f.default for f in fields(base)}
    own_keys = []  # (option, its schema): a plugin algorithm's keys of its own
    for option in group_options(group, code):
        schema = schemas.get(option, schemas.get("base"))
        if any(f.name not in base_defaults for f in fields(schema)):
            own_keys.append((option, schema))
        differs = [
            f"`{f.name}={format_default(f.default)}`"
            for f in fields(schema)
            if f.name in base_defaults and f.default is not MISSING and f.default != base_defaults[f.name]
        ]
        lines.append(
            _row(
                [
                    f"`{option}`",
                    _what(group, option),
                    f"`{schema.__name__}`",
                    ", ".join(differs),
                ]
            )
        )
    lines += [""] + _key_table(base, base(), f"{group}.") + [""]
    for option, schema in own_keys:
        lines += [f"Keys of `{group}={option}` alone:", ""]
        lines += _key_table(schema, schema(name=option), f"{group}.", skip=base_defaults) + [""]
    return lines


def markdown(code: bool = True) -> str:
    """The whole of docs/configuration.md; ``code``: with the options plugins registered (none are
    loaded unless a plugin is installed or named), else conf/'s alone, as the committed file."""
    hints = get_type_hints(Config)
    config = Config()
    top = [f for f in fields(Config) if f.name not in SCHEMAS]
    scalars = [f for f in top if not is_dataclass(getattr(config, f.name))]
    blocks = [f for f in top if is_dataclass(getattr(config, f.name))]
    lines = [
        "# Configuration",
        "",
        f"<!-- generated: python -m rlexp.compose.config_doc > {DOC} (from rlexp/config/schema.py and conf/) -->",
        "",
        INTRO,
        "",
        "## Top-level keys",
        "",
        _row(["key", "default", "meaning"]),
        _row(["---"] * 3),
    ]
    lines += [
        _row([f"`{f.name}`", f"`{format_default(getattr(config, f.name))}`", field_help(Config, f.name)])
        for f in scalars
    ]
    lines += ["", "## Blocks", ""]
    for f in blocks:
        value = getattr(config, f.name)
        lines += [f"### `{f.name}`", "", field_help(Config, f.name), ""]
        lines += _key_table(type(value), value, f"{f.name}.") + [""]
    lines += ["## Groups", ""]
    defaults = _default_options()
    for group in SCHEMAS:
        lines += _group(group, hints[group], defaults[group], code)
    lines += [
        "## Presets (`+experiment=name`)",
        "",
        "A preset sets groups and keys (`# @package _global_`); the command line still changes any of them.",
        "",
        _row(["preset", "what it is"]),
        _row(["---"] * 2),
    ]
    lines += [
        _row([f"`{name}`", _comment(CONF_DIR / "experiment" / f"{name}.yaml")]) for name in group_options("experiment")
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    from rlexp.compose.plugins import load_plugins

    with_plugins = "--plugins" in sys.argv[1:]  # the installed plugins' options too (the committed file: rlexp's own)
    if with_plugins:
        load_plugins()
    print(markdown(with_plugins), end="")
