"""The launcher's config node, ``hydra/launcher=packed`` (conf/hydra/launcher/rlexp_packed.yaml names it)."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore


@dataclass
class PackedLauncherConf:
    _target_: str = "hydra_plugins.rlexp_packed_launcher.packed_launcher.PackedLauncher"
    n_jobs: int = -1  # packs trained at once, each in its own joblib (loky) worker process; -1 = one per core
    max_members: int = 96  # members (cells x num_seeds) per pack at most; a larger group is split


ConfigStore.instance().store(group="hydra/launcher", name="packed", node=PackedLauncherConf, provider="rlexp")
