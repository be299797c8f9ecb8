"""Per-member random streams (rlexp/envs/streams.py): a member's draws depend on its seed alone."""

from __future__ import annotations

import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.envs.streams import MemberStreams, member_generator

torch.set_num_threads(1)


# ---------------------------------------------------------------- member streams
def test_member_streams_depend_on_the_member_seed_only():
    a = MemberStreams([5, 7], block=16)
    b = MemberStreams([9, 7], block=16)
    alone = MemberStreams([7], block=16)
    draws_a, draws_b, draws_alone = [], [], []
    for n in (3, 5, 7, 1, 20, 2):  # crosses block refills, including one draw larger than a block
        draws_a.append(torch.as_tensor(a.uniform(n)).clone())
        draws_b.append(torch.as_tensor(b.uniform(n)).clone())
        draws_alone.append(torch.as_tensor(alone.uniform(n)).clone())
        assert draws_a[-1].shape == (2, n) and draws_a[-1].dtype == torch.float64
    xa, xb, x1 = torch.cat(draws_a, 1), torch.cat(draws_b, 1), torch.cat(draws_alone, 1)
    assert torch.equal(xa[1], xb[1])
    assert torch.equal(xa[1], x1[0])
    assert not torch.equal(xa[0], xb[0])  # seeds 5 and 9 differ
    assert not torch.equal(xa[0], xa[1])
    for x in (xa, xb):
        assert (x >= 0).all() and (x < 1).all()
    # the first draw is the start of the member's own generator (purpose 2 = streams)
    first = torch.rand(16, generator=member_generator(7, 2), dtype=torch.float64)[:3]
    assert torch.equal(draws_a[0][1], first)
    assert len(set(xa[1].tolist())) == xa.shape[1]  # no repeats within a member
