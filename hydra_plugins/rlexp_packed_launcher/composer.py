"""A grid's job configs as Hydra composes them, Hydra's composition done once per structure.

Hydra's ``load_sweep_config`` composes every job from scratch: the defaults list, every yaml file merged,
~0.1 s a job. A job's config depends on its group overrides (``activation=relu``: which files are merged)
through that composition, and on its other overrides (``optimizer.lr=0.01``, ``seed=8``) only through
``_apply_overrides_to_config``, which Hydra applies to the merged config last. So ``SweepComposer``
composes each distinct list of group overrides (a *structure*) once, with Hydra, and makes a job's config
from its structure's: the value overrides applied by Hydra's own function, then what Hydra sets per job
(the task overrides, ``hydra.job.override_dirname``; the structure holds the master config's resolver
cache). A job whose sweep overrides hold a ``hydra.`` key is composed by Hydra whole.
``tests/plugins/test_packed_launcher.py`` checks every job's config against Hydra's.
"""

import copy
from dataclasses import dataclass
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl, get_overrides_dirname
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class JobSpec:
    """One job of a grid: what it takes to compose its config again (in a pack's worker too)."""

    num: int  # hydra.job.num
    overrides: tuple[str, ...]  # the job's sweep overrides, as Hydra's sweeper lists them
    structure: int | None  # its structure's index in ``SweepComposer.structures``; None: Hydra composes it whole
    values: tuple[str, ...] = ()  # its overrides that Hydra applies to the merged config (not group overrides)


class Overrides:
    """Hydra's parsed overrides, each distinct line parsed once."""

    def __init__(self) -> None:
        self._parsed: dict[str, Override] = {}
        self._parser = OverridesParser.create()

    def __call__(self, lines: tuple[str, ...] | list[str]) -> list[Override]:
        todo = [line for line in dict.fromkeys(lines) if line not in self._parsed]
        for line, override in zip(todo, self._parser.parse_overrides(todo) if todo else []):
            self._parsed[line] = override
        return [self._parsed[line] for line in lines]


class SweepComposer:
    """``load_sweep_config(master, overrides)`` of a grid's jobs, each structure composed once (module doc)."""

    def __init__(self, loader: ConfigLoaderImpl) -> None:
        self.loader = loader
        self.structures: list[DictConfig] = []  # Hydra's composition of the hydra and group overrides
        self._index: dict[tuple[str, ...], int] = {}
        self._parse = Overrides()
        self._is_group: Any = None  # the config repository's group_exists, once the master config is known
        self._values: dict[str, bool] = {}  # by override line: Hydra applies it to the merged config
        self._scratch: dict[tuple[int, tuple[str, ...]], DictConfig] = {}  # (structure, value keys): a copy

    def spec(self, master: DictConfig, overrides: list[str] | tuple[str, ...], num: int) -> JobSpec:
        """The job ``overrides`` of the grid ``master`` runs as job ``num``; its structure composed if new
        (Hydra's ConfigCompositionException when it cannot be)."""
        parsed = self._parse(tuple(overrides))
        if any(o.is_hydra_override() or o.is_sweep_override() for o in parsed):
            return JobSpec(num, tuple(overrides), None)
        hydra_lines = [str(x) for x in master.hydra.overrides.hydra]
        if self._is_group is None:
            repo = self.loader._parse_overrides_and_create_caching_repo(master.hydra.job.config_name, hydra_lines)[1]
            self._is_group = repo.group_exists
        for o in parsed:
            if o.input_line not in self._values:
                self._values[o.input_line] = _is_value(o, self._is_group)
        values = tuple(o.input_line for o in parsed if self._values[o.input_line])
        groups = tuple(o.input_line for o in parsed if o.input_line not in values)
        if groups not in self._index:
            config = self.loader.load_configuration(
                config_name=master.hydra.job.config_name, overrides=hydra_lines + list(groups), run_mode=RunMode.RUN
            )
            OmegaConf.copy_cache(from_config=master, to_config=config)  # ${now:...} as the master resolved it
            self._index[groups] = len(self.structures)
            self.structures.append(config)
        return JobSpec(num, tuple(overrides), self._index[groups], values)

    def config(self, master: DictConfig, spec: JobSpec, fresh: bool = True) -> DictConfig:
        """The config Hydra's ``load_sweep_config`` composes for ``spec``, with ``hydra.job.num`` and ``id``
        set. ``fresh=False``: a config to read before the next call, the same object for many jobs: the
        structure's own when the job adds no value override, else a copy of it kept for the jobs that set
        the same keys (each sets every one of them, so none keeps another's value; only plain
        ``key=value`` overrides of a value that is no dict, which replace what is there)."""
        if spec.structure is None:
            config = self.loader.load_sweep_config(master, list(spec.overrides))
        elif fresh or not spec.values:
            config = job_config(self.structures[spec.structure], spec, self._parse, fresh)
        else:
            values = self._parse(spec.values)
            if any(o.is_add() or o.is_force_add() or o.is_delete() or isinstance(o.value(), dict) for o in values):
                config = job_config(self.structures[spec.structure], spec, self._parse)
            else:
                keys = (spec.structure, tuple(o.key_or_group for o in values))
                if keys not in self._scratch:
                    self._scratch[keys] = copy.deepcopy(self.structures[spec.structure])
                config = job_config(self._scratch[keys], spec, self._parse, fresh=False, in_place=True)
        config.hydra.job.id = f"{config.hydra.job.name}_{spec.num}"
        config.hydra.job.num = spec.num
        return config

    def check(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """What Hydra's sweeper checks of each job before launching (with ``load_sweep_config``): that it
        can be composed. Its structure is composed (Hydra's error when it cannot be) and its overrides
        parsed; its value overrides are applied when the launcher plans the job, before any job starts.
        Returns the structure's config."""
        spec = self.spec(master_config, sweep_overrides, 0)
        if spec.structure is None:
            return self.loader.load_sweep_config(master_config, list(sweep_overrides))
        return self.structures[spec.structure]


def _is_value(override: Override, is_group: Any) -> bool:
    """Hydra's own rule (``defaults_list.Overrides``): an override is applied to the merged config, not
    used to pick files, when its value is a dict or its key names no config group."""
    return isinstance(override.value(), dict) or not is_group(override.key_or_group)


def job_config(
    structure: DictConfig, spec: JobSpec, parse: Overrides, fresh: bool = True, in_place: bool = False
) -> DictConfig:
    """Job ``spec``'s config from its ``structure``'s (Hydra's composition of its group overrides): its
    value overrides applied as Hydra applies them, then its task overrides and ``override_dirname`` as
    Hydra sets them. The structure's config itself (not a copy) when ``fresh`` is False and the job adds
    no value override; ``in_place``: applied to ``structure`` itself."""
    if not spec.values and not fresh:
        return structure
    config = structure if in_place else copy.deepcopy(structure)
    ConfigLoaderImpl._apply_overrides_to_config(parse(spec.values), config)
    parsed = parse(spec.overrides)
    task = config.hydra.overrides.task
    task.clear()
    task.extend([o.input_line for o in parsed])
    dirname = config.hydra.job.config.override_dirname
    config.hydra.job.override_dirname = get_overrides_dirname(
        overrides=parsed, kv_sep=dirname.kv_sep, item_sep=dirname.item_sep, exclude_keys=dirname.exclude_keys
    )
    return config
