"""The collapse instruments of multi-agent policies (rlexp/diagnostics/collapse.py): repeats, entropy
and the collapse flag of an action window."""

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo", reason="pip install -e '.[marl]'")
pytest.importorskip("mpe2", reason="pip install -e '.[marl]'")
pytest.importorskip("vmas", reason="pip install -e '.[marl]'")


from rlexp.config.schema import DiagnosticsConfig  # noqa: E402
from rlexp.diagnostics.collapse import ActionWindow  # noqa: E402
from rlexp.envs.marl import AgentSpace  # noqa: E402


# ====================================================================== collapse instruments
def test_action_window_measures_repeats_entropy_and_flags_collapse():
    agents = [AgentSpace("a", 2, True, 4), AgentSpace("b", 2, False, 1, np.array([-1.0]), np.array([1.0]))]
    window = ActionWindow(agents, 2, DiagnosticsConfig(collapse_repeat=0.9, collapse_entropy=0.05))
    logits = torch.zeros(2, 1, 4)
    for t in range(8):
        window.add(0, np.array([[1], [t % 4]]), logits)  # member 0 repeats action 1, member 1 cycles
        window.add(1, np.array([[[0.95]], [[-0.95 + 0.25 * t]]]), torch.zeros(2, 1, 1))
    metrics, collapsed = window.take(100)
    assert metrics["agent0/action_repeat_rate"].tolist() == [7 / 8, 0.0]
    assert metrics["agent0/action_entropy"].tolist() == [0.0, 1.0]
    assert metrics["agent1/action_repeat_rate"].tolist() == [7 / 8, 0.0]
    assert metrics["agent0/action_saturation"].tolist() == [0.0, 0.0]
    assert collapsed == {
        0: {"agent": "agent0", "step": 100, "instrument": "action_entropy", "value": 0.0, "bound": 0.05}
    }
