"""rlexp/replay.py's pieces: a member's own non-finite gradient found in its records."""

from __future__ import annotations

import pytest
import torch

from rlexp import replay
from rlexp.config.schema import ConfigError


def test_member_anomaly_finds_the_members_own_non_finite_gradient():
    """Two members on the brink in different places: each one's anomaly is its own backward function."""
    w = torch.tensor([[1e30, 1.0], [1.0, 1.0]], requires_grad=True)  # [P=2, 2]
    x = torch.tensor([[1.0, 1.0], [0.0, 1.0]], requires_grad=True)
    found, backward = [], torch.Tensor.backward
    for member in (0, 1):
        with replay.MemberAnomaly(member, members=2) as anomaly:
            y = (w * 1e10).square()  # member 0: overflows to inf here
            z = x.sqrt() * 0 + y * 0  # member 1: sqrt's gradient at 0 is inf
            z.sum(1).sum().backward()
        found.append(anomaly.found[0])
        assert torch.Tensor.backward is backward and not torch.is_anomaly_enabled()
    assert found == ["PowBackward0", "SqrtBackward0"], found


def test_replay_of_a_missing_dir_says_it_is_not_a_directory(tmp_path, capsys):
    """A mistyped run dir is named as not a directory (not as a dir without a finished job), exit 2,
    nothing made."""
    from rlexp import replay

    missing = tmp_path / "no_such_run"
    assert replay.main([str(missing), "seed=0"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"config error: run dir: {missing} is not a directory; pass the dir of a finished job\n"
    assert not missing.exists()


def test_no_replay_overwrites_another(tmp_path):
    """A seed's first replay goes to replay_seed_<seed>/, later ones to _2/, _3/; an out= that holds a
    replay is refused naming it."""
    assert replay.replay_dir(tmp_path, 4, None) == tmp_path / "replay_seed_4"
    (tmp_path / "replay_seed_4").mkdir()
    assert replay.replay_dir(tmp_path, 4, None) == tmp_path / "replay_seed_4"  # empty: nothing to keep
    (tmp_path / "replay_seed_4" / "metrics.jsonl").write_text("")
    assert replay.replay_dir(tmp_path, 4, None) == tmp_path / "replay_seed_4_2"
    (tmp_path / "replay_seed_4_2").mkdir()
    (tmp_path / "replay_seed_4_2" / "summary.json").write_text("{}")
    assert replay.replay_dir(tmp_path, 4, None) == tmp_path / "replay_seed_4_3"
    out = tmp_path / "replay_seed_4"
    with pytest.raises(ConfigError, match=f"^config error: out: {out} holds an earlier replay; set out to another"):
        replay.replay_dir(tmp_path, 4, str(out))
    assert replay.replay_dir(tmp_path, 4, str(tmp_path / "elsewhere")) == tmp_path / "elsewhere"
