"""The network group's registry: ``network=<option>`` -> its schema and the population network
``RunContext.make_net`` builds (every class takes ``PopMLP``'s constructor arguments and the
environment's ``observation_space``), and the check that observations fit the network."""

from __future__ import annotations

from dataclasses import dataclass

from rlexp.config.schema import CNNConfig, ConfigError, LSTMNetworkConfig, NatureCNNConfig, NetworkConfig
from rlexp.nn.conv import PopCNN, check_conv
from rlexp.nn.nets import PopMLP
from rlexp.nn.recurrent import RecurrentNet


@dataclass(frozen=True)
class Network:
    """An option of the network group: its config class, the population network it builds, and whether
    it reads image observations [C, H, W] (a convolutional torso) or vectors."""

    schema: type
    build: type
    images: bool = False


NETWORKS: dict[str, Network] = {
    "mlp": Network(NetworkConfig, PopMLP),
    "lstm": Network(LSTMNetworkConfig, RecurrentNet),
    "cnn": Network(CNNConfig, PopCNN, images=True),
    "nature_cnn": Network(NatureCNNConfig, PopCNN, images=True),
}


def check_observations(network: NetworkConfig, shape: tuple[int, ...], env_id: str) -> None:
    """Image observations [C, H, W] need a convolutional torso and a convolutional torso needs them
    (ConfigError at network); its layers must fit the map (``check_conv``)."""
    image = len(shape) == 3
    if image and not NETWORKS[network.name].images:
        raise ConfigError(
            "network",
            f"network={network.name} cannot read {env_id}'s image observations {list(shape)}",
            "use network=cnn (MinAtar's 10x10 maps) or network=nature_cnn (84x84 frames)",
        )
    if NETWORKS[network.name].images and not image:
        raise ConfigError(
            "network",
            f"network={network.name} needs image observations [C, H, W]; {env_id}'s are {list(shape)}",
            "use network=mlp",
        )
    if image:
        check_conv(network, shape, env_id)
