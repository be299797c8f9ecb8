"""The configuration layer: presets never lock their groups, the schemas come from the registries,
one list of non-cell keys, docs/configuration.md generated from the schemas, every numeric key's domain."""

from __future__ import annotations

import dataclasses
import os
import pickle
import typing
from dataclasses import fields
from pathlib import Path

import pytest
from composing import compose_config, compose_hydra, merging_as_shipped, set_keys, writes_after_options
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from rlexp.compose.config_doc import markdown
from rlexp.compose.registry import DOC, SCHEMAS, group_options, register
from rlexp.compose.validate import validate
from rlexp.config.schema import NON_CELL_KEYS, Config, ConfigError, field_help
from rlexp.optim.optimizers import OPTIMIZERS
from rlexp.optim.pipeline import CLIPPERS

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
STABILITY_GROUPS = ("activation", "init", "normalization", "clipping", "optimizer")


# the top-level presets (each nested nan_hunt/<change> is nan_hunt with one change: tests/compose/test_presets.py)
PRESETS = [p.stem for p in sorted((CONF / "experiment").glob("*.yaml"))]


def _option_node(writes: dict[str, list], group: str, option: str):
    """The group's node of the preset composed with ``group=option``: the option's schema and name (an option yaml
    holds nothing else: tested here) with what the preset's configs write into the group merged onto them."""
    node = OmegaConf.structured(SCHEMAS[group][option])
    node.name = option
    for written in writes[group]:
        node.merge_with(written)
    return node


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_composes_with_every_stability_option(preset):
    """A preset sets keys of its groups; every option of those groups still composes and validates (one group
    changed at a time: the preset's own node put back before the next group)."""
    cfg = compose_config([f"+experiment={preset}"])
    writes = writes_after_options([f"+experiment={preset}"], STABILITY_GROUPS)
    for group in STABILITY_GROUPS:
        own = pickle.loads(pickle.dumps(cfg[group]))  # a deep copy (copy.deepcopy's, 4x faster)
        for option in group_options(group):
            cfg[group] = _option_node(writes, group, option)
            assert cfg[group].name == option
            validate(cfg)
        cfg[group] = own
    assert cfg == compose_config([f"+experiment={preset}"])


def test_a_preset_with_an_option_is_built_as_hydra_composes_it():
    """The construction above against Hydra itself, on the preset that writes keys of the most of these groups
    (after its algorithm's yaml writes the learning rate): one option of each schema."""
    preset = "seed_critic"
    preset_cfg = compose_config([f"+experiment={preset}"])
    writes = writes_after_options([f"+experiment={preset}"], STABILITY_GROUPS)
    assert [len(writes[group]) for group in STABILITY_GROUPS] == [0, 1, 1, 1, 2]
    for group in STABILITY_GROUPS:
        for option in {SCHEMAS[group][option]: option for option in group_options(group)}.values():
            built = pickle.loads(pickle.dumps(preset_cfg))
            built[group] = _option_node(writes, group, option)
            composed = compose_hydra([f"+experiment={preset}", f"{group}={option}"])
            assert OmegaConf.to_container(built) == OmegaConf.to_container(composed), (group, option)
            assert OmegaConf.get_type(built[group]) is OmegaConf.get_type(composed[group])


COMPOSITIONS = [
    [],
    ["optimizer.lr=0.1", "num_seeds=3", "network.hidden=[8,8]"],
    ["+experiment=nan_hunt", "total_steps=100", "optimizer=adam", "optimizer.lr=0.5"],
    ["algo.tau=0.1", "algo=td3", "env=pendulum", "algo.tau=0.2", "+env.kwargs.g=9.0"],
    ["hydra.run.dir=/tmp/run", "logger.mode=disabled", "hydra/launcher=rlexp_joblib", "algo.gamma=0.5"],
    ["network={hidden:[4]}", "intervention=redo", "intervention.tau=0.5", "debug.crash_at_step=5"],
    ["~debug.inject"],
    ["optimizer.lrr=1"],
    ["activation=rleu"],
    ["total_steps=abc"],
]


@pytest.mark.parametrize("overrides", COMPOSITIONS, ids=[" ".join(o) or "defaults" for o in COMPOSITIONS])
def test_the_tests_composition_is_hydras(overrides):
    """tests/composing.py: the group choices composed once, the key overrides applied as Hydra applies them."""
    try:
        expected = compose_hydra(overrides)
    except Exception as err:  # the same refusal, word for word
        with pytest.raises(type(err)) as refused:
            compose_config(overrides)
        assert str(refused.value) == str(err) and str(refused.value.__cause__) == str(err.__cause__)
        return
    cfg = compose_config(overrides)
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(expected)
    assert OmegaConf.is_struct(cfg) and OmegaConf.get_type(cfg.algo) is OmegaConf.get_type(expected.algo)
    assert compose_config(overrides) is not cfg  # each call its own config


def _nodes(node, path: str = "") -> dict[str, tuple]:
    """Every node of a config by its dotted path: its type, its value (a container's: None) and its flags."""
    value = None if OmegaConf.is_config(node) else node._value()
    found = {path: (OmegaConf.get_type(node), value, node._metadata.flags)}
    if OmegaConf.is_config(node) and not node._is_missing() and not node._is_none():
        for key in node.keys() if OmegaConf.is_dict(node) else range(len(node)):
            found.update(_nodes(node._get_node(key), f"{path}.{key}"))
    return found


PREFIX_SETS = [
    [],
    ["+experiment=seed_critic"],
    ["activation=tanh"],
    ["activation=tanh", "optimizer=sgd"],
    ["algo=ppo", "env=pendulum"],
    ["algo=sac", "env=pendulum"],
    ["+experiment=nan_hunt", "intervention=redo"],
]


def test_a_composition_from_merged_prefixes_is_hydras():
    """tests/composing.py merges a defaults list from the longest prefix it merged before: node for node (type,
    value, flags; the hydra node included) what Hydra's own merge gives, for compositions that share prefixes
    (each composed twice: the second from its whole defaults list merged before)."""
    for overrides in PREFIX_SETS:
        with merging_as_shipped():
            shipped = _nodes(compose_hydra(overrides, return_hydra_config=True))
        for _ in range(2):
            assert _nodes(compose_hydra(overrides, return_hydra_config=True)) == shipped, overrides


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_option_schema_of_a_group_has_the_same_keys(group):
    keys = {tuple(f.name for f in fields(schema)) for schema in SCHEMAS[group].values()}
    assert len(keys) == 1, keys


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_key_says_what_it_does(group):
    for schema in SCHEMAS[group].values():
        assert all(field_help(schema, f.name) for f in fields(schema)), schema.__name__


def test_the_schemas_come_from_the_registries():
    assert SCHEMAS["clipping"] == {name: entry.schema for name, entry in CLIPPERS.items()}
    assert SCHEMAS["optimizer"] == {name: entry.schema for name, entry in OPTIMIZERS.items()}


def test_register_is_idempotent_and_stores_every_schema():
    register()
    register()
    store = ConfigStore.instance()
    for group, options in SCHEMAS.items():
        assert set(store.list(f"schema/{group}")) == {f"{option}.yaml" for option in options}


def test_option_yamls_hold_no_value_their_schema_holds():
    """Each default is written once: an option yaml names its schema and option, nothing else
    (an algorithm's yaml also sets other groups' keys: its learning rate, its env count; an env's its api)."""
    for group in (*STABILITY_GROUPS, "network", "divergence", "intervention", "env", "algo"):
        for option in group_options(group, code=False):
            raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{option}.yaml"))
            raw.pop("defaults")
            own = raw.pop("algo") if group == "algo" else raw
            if group == "env":  # a multi-agent world also names its api (and VMAS, which has none, its episode limit)
                assert "id" in own and set(own) <= {"id", "api", "max_episode_steps"}, (group, option, own)
            else:
                assert set(own) == {"name"}, (group, option, own)


def test_the_top_level_config_holds_no_values():
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml"))
    assert set(raw) == {"defaults", "hydra"}


def test_non_cell_keys_are_hydras_exclusions():
    cfg = compose_hydra(return_hydra_config=True)
    assert list(cfg.hydra.job.config.override_dirname.exclude_keys) == list(NON_CELL_KEYS)


def test_configuration_doc_is_generated_from_the_schemas():
    expected = markdown(code=False)  # rlexp's own options, an installed plugin's aside
    assert (ROOT / DOC).read_text() == expected, f"regenerate it: python -m rlexp.compose.config_doc > {DOC}"


# ====================================================================== every numeric key has a domain
# every numeric key (int, float, a list of ints; optional or not) -> a value outside its domain
OUT_OF_DOMAIN: dict[str, str] = {
    "activation.negative_slope": "-0.1",
    "activation.alpha": "0",
    "init.gain": "0",
    "init.bias": "inf",
    "init.last_layer_scale": "0",
    "init.last_layer_gain": "-1",
    "normalization.eps": "-1e-5",
    "normalization.momentum": "0",
    "normalization.g_init": "0",
    "normalization.power_iterations": "0",
    "clipping.max_norm": "0",
    "clipping.clip_value": "-1",
    "clipping.clip_factor": "0",
    "clipping.eps": "0",
    "optimizer.lr": "0",
    "optimizer.weight_decay": "-0.01",
    "optimizer.beta1": "1",
    "optimizer.beta2": "1.5",
    "optimizer.eps": "-1e-8",
    "optimizer.alpha": "1",
    "optimizer.decay": "-0.1",
    "optimizer.epsilon": "-1e-10",
    "optimizer.momentum": "1",
    "network.hidden": "[]",
    "network.output_scale": "0",
    "network.cell_size": "0",
    "network.encoder": "[0]",
    "algo.gamma": "1.5",
    "algo.buffer_size": "0",
    "algo.batch_size": "0",
    "algo.learning_starts": "-1",
    "algo.train_frequency": "0",
    "algo.gradient_steps": "0",
    "algo.tau": "0",
    "algo.start_e": "1.5",
    "algo.end_e": "-0.1",
    "algo.exploration_fraction": "0",
    "algo.target_update_period": "0",
    "algo.huber_delta": "0",
    "algo.clip_delta": "-1",
    "algo.r_max": "0",
    "algo.num_steps": "0",
    "algo.gae_lambda": "1.5",
    "algo.update_epochs": "0",
    "algo.num_minibatches": "0",
    "algo.clip_coef": "0",
    "algo.ent_coef": "-0.01",
    "algo.vf_coef": "-1",
    "algo.min_std": "0",
    "algo.init_std": "0",
    "algo.anneal_steps": "0",
    "algo.exploration_noise": "-0.1",
    "algo.exploration_noise_end": "-0.1",
    "algo.exploration_anneal_steps": "-1",
    "algo.exploration_anneal_every": "-1",
    "algo.policy_delay": "0",
    "algo.target_noise": "-0.2",
    "algo.target_noise_clip": "-0.5",
    "algo.alpha": "0",
    "algo.target_entropy": "nan",
    "algo.log_std_min": "-inf",
    "algo.log_std_max": "nan",
    "algo.unroll_steps": "0",
    "algo.td_steps": "0",
    "algo.dynamics_grad_scale": "1.5",
    "algo.state_dim": "0",
    "algo.value_coef": "-1",
    "algo.policy_coef": "-1",
    "algo.policy_temperature": "0",
    "algo.gumbel_temperature": "0",
    "algo.policy_reg": "-1",
    "env.num_envs": "0",
    "env.max_episode_steps": "0",
    "env.shift.every": "0",
    "divergence.q_bound_factor": "0",
    "divergence.grad_norm_bound": "-1",
    "divergence.patience": "0",
    "regularization.l1": "-1",
    "regularization.l2": "nan",
    "regularization.l2_init": "-1",
    "intervention.every": "0",
    "intervention.tau": "0",
    "intervention.shrink": "1.5",
    "intervention.perturb": "-0.1",
    "intervention.layers": "0",
    "actor.hidden": "[]",
    "actor.last_layer_gain": "0",
    "critic.hidden": "[64,0]",
    "critic.last_layer_gain": "-1",
    "critic.action_layer": "-1",
    "obs_norm.clip": "0",
    "reward_norm.clip": "-1",
    "diagnostics.every": "-1",
    "diagnostics.histogram_every": "-1",
    "diagnostics.dormant_tau": "1",
    "diagnostics.srank_delta": "0",
    "diagnostics.collapse_repeat": "1.5",
    "diagnostics.collapse_entropy": "-0.1",
    "debug.inject.member": "-2",
    "debug.inject.step": "-2",
    "debug.crash_at_step": "-2",
    "logger.log_every": "0",
    "logger.init_timeout": "-1",
    "eval.every": "-1",
    "eval.episodes": "-1",
    "checkpoint.every": "-1",
    "pbt.interval": "-1",
    "pbt.fraction": "0.6",
    "pbt.window": "0",
    "eval.epsilon": "1.5",
    "total_steps": "0",
    "seed": "-1",
    "num_seeds": "0",
    "threads": "999",
}


def _is_numeric(hint: typing.Any) -> bool:
    """int, float, list[int], or any of them optional (bool is not numeric)."""
    args = typing.get_args(hint) if typing.get_origin(hint) is not list else (hint,)
    for arg in args or (hint,):
        if arg in (int, float) or (typing.get_origin(arg) is list and typing.get_args(arg) == (int,)):
            return True
    return False


def numeric_keys() -> set[str]:
    """Every numeric key reachable from Config, dotted (a group's keys from each of its option schemas)."""
    keys: set[str] = set()

    def walk(schema: type, prefix: str) -> None:
        hints = typing.get_type_hints(schema)
        for f in fields(schema):
            key, hint = f"{prefix}{f.name}", hints[f.name]
            if not prefix and f.name in SCHEMAS:
                for option_schema in SCHEMAS[f.name].values():
                    walk(option_schema, f"{key}.")
            elif dataclasses.is_dataclass(hint):
                walk(hint, f"{key}.")
            elif _is_numeric(hint):
                keys.add(key)

    walk(Config, "")
    return keys


def test_the_out_of_domain_table_covers_every_numeric_key():
    """A new numeric key needs a domain (a check in validate or beside its registry) and a row here."""
    keys = numeric_keys()
    assert "optimizer.lr" in keys and "debug.inject.member" in keys and "network.hidden" in keys
    assert set(OUT_OF_DOMAIN) == keys, (sorted(keys - set(OUT_OF_DOMAIN)), sorted(set(OUT_OF_DOMAIN) - keys))


def refused_keys(base: list[str], keys: list[str]) -> dict[str, str | None]:
    """For each key, the key validate names once the key is set to its out-of-domain value on the command
    line after ``base``, or None when it is accepted: one composed config, each key set as Hydra sets a
    command-line override and put back after its check."""
    cfg, named = compose_config(base), {}
    for key in keys:
        before = OmegaConf.select(cfg, key)
        before = OmegaConf.to_container(before) if OmegaConf.is_config(before) else before
        set_keys(cfg, [f"{key}={OUT_OF_DOMAIN[key]}"])
        try:
            validate(cfg)
            named[key] = None
        except ConfigError as err:
            named[key] = err.key
        OmegaConf.update(cfg, key, before, merge=False)
    assert cfg == compose_config(base)  # every key put back
    return named


@pytest.mark.parametrize("group", sorted(SCHEMAS))
def test_every_numeric_key_of_every_option_refuses_a_value_outside_its_domain(group):
    """With each option of the group chosen, each numeric key of the group is checked (a preset may set a
    key the option does not read), naming the key."""
    register()
    keys = [k for k in OUT_OF_DOMAIN if k.startswith(f"{group}.")]
    for option in group_options(group):
        named = refused_keys([f"{group}={option}"], keys)
        assert named == {key: key for key in keys}, option


def test_every_other_numeric_key_refuses_a_value_outside_its_domain():
    register()
    keys = [k for k in OUT_OF_DOMAIN if not k.startswith(tuple(f"{g}." for g in SCHEMAS))]
    assert refused_keys([], keys) == {key: key for key in keys}


def test_threads_beyond_the_cores_names_the_largest_allowed():
    cores = len(os.sched_getaffinity(0))
    validate(compose_config([f"threads={cores}"]))
    cfg = compose_config([f"threads={cores + 1}"])
    with pytest.raises(ConfigError, match=rf"at most {cores}, the cores this process may use") as err:
        validate(cfg)
    assert err.value.key == "threads"


def test_a_network_without_hidden_layers_is_refused():
    cfg = compose_config(["network.hidden=[]"])
    with pytest.raises(ConfigError, match="a network needs at least one hidden layer"):
        validate(cfg)
