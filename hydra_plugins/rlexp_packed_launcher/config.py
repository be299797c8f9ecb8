"""The launcher's config node, ``hydra/launcher=packed`` (conf/hydra/launcher/rlexp_packed.yaml names it).

Every default is written here once; docs/grids.md#packed-grids lists them."""

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore


@dataclass
class SubmititConf:
    """submitit's settings for ``backend=submitit_local`` and ``backend=slurm`` (one submitit job per pack)."""

    timeout_min: int = 60  # per pack; a pack still running after this is killed (its cells unfinished)
    cpus_per_task: int = 2  # one torch thread (threads=1) plus the environments and W&B's process
    mem_gb: int = 8  # per pack (slurm): a pack holds up to max_members members, a grid job of rlexp_slurm 8
    partition: str | None = None  # slurm: the cluster's partition (null = its default partition)
    require_partition: bool = False  # slurm: refuse partition=null (a cluster without a default partition)
    account: str | None = None  # slurm
    array_parallelism: int = 64  # slurm: packs of the array running at once
    setup: list[str] = field(default_factory=lambda: ["export WANDB_MODE=offline"])  # slurm: shell lines per pack


@dataclass
class RayInitConf:
    address: str | None = None  # null starts a local Ray cluster; "auto" joins a running one
    num_cpus: int | None = None  # a local cluster's CPUs (null = every core)
    include_dashboard: bool = False


@dataclass
class RayRemoteConf:
    num_cpus: int = 1  # per pack (threads=1)


@dataclass
class RayConf:
    """Ray's settings for ``backend=ray`` (one remote task per pack): ``ray.init`` and ``ray.remote``."""

    init: RayInitConf = field(default_factory=RayInitConf)
    remote: RayRemoteConf = field(default_factory=RayRemoteConf)


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.rlexp_packed_launcher.packed_launcher.PackedLauncher"
    backend: str = "local"  # where packs run: local (joblib), submitit_local, slurm, ray (backends.py)
    n_jobs: int = -1  # local: packs trained at once, each in its own joblib (loky) worker; -1 = one per core
    max_members: int = 96  # members (cells x num_seeds) per pack at most; a larger group is split
    dry_run: bool = False  # compose, check and plan the packs, print the plan; train nothing, make no job dir
    submitit: SubmititConf = field(default_factory=SubmititConf)
    ray: RayConf = field(default_factory=RayConf)


ConfigStore.instance().store(group="hydra/launcher", name="packed", node=PackedLauncherConf, provider="rlexp")
