"""Task shifts (rlexp/envs/shift.py) against a direct computation: the observation a member sees is the raw
observation indexed by its permutation, the environment receives perm[action], each task's permutation is
the member's next draw of ``torch.randperm`` from its own generator, at each multiple of ``every`` but at the
budget's last step; CartPoles stepped together or one by one alike; a member's tasks do not depend on the
population; evaluation's view reads the current task and never switches it; the state continues exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rlexp.config.schema  # noqa: F401  (registers the structured-config schemas with Hydra)
from rlexp.config.schema import EnvConfig, ShiftConfig
from rlexp.envs.gym import PopulationEnv
from rlexp.envs.shift import PURPOSE, ShiftedEnv, TaskShift
from rlexp.envs.streams import member_generator

P, E, SEEDS = 2, 2, [3, 4]  # P * E = 4: CartPoles stepped together when allowed


def expected_perms(seed: int, size: int, tasks: int) -> list[np.ndarray]:
    """Task 0 the identity, then the member's successive draws."""
    generator = member_generator(seed, PURPOSE)
    return [np.arange(size)] + [torch.randperm(size, generator=generator).numpy() for _ in range(tasks - 1)]


def env_pair(kind: str, every: int, total: int, together: bool) -> tuple[ShiftedEnv, PopulationEnv]:
    """A shifted population and a plain twin of the same seeds (the raw world)."""
    cfg = EnvConfig(id="CartPole-v1", num_envs=E, max_episode_steps=20)
    plain = PopulationEnv(cfg, SEEDS, together=together)
    env = PopulationEnv(cfg, SEEDS, together=together)
    shift = TaskShift.of(ShiftConfig(kind=kind, every=every), env, SEEDS, total)
    return ShiftedEnv(env, shift, counts=True), plain


def actions_at(t: int) -> np.ndarray:
    return np.array([[t % 2, (t // 3) % 2], [(t + 1) % 2, 1 - (t // 2) % 2]])  # [P, E]


@pytest.mark.parametrize("together", [True, False])
def test_permute_obs_shows_each_member_its_raw_observation_indexed_by_its_permutation(together):
    every, total, steps = 6, 30, 30  # per member: a vector step is E = 2 steps; switches at 6, 12, 18, 24
    env, plain = env_pair("permute_obs", every, total, together)
    assert (env.cartpoles is not None) == together
    perms = [expected_perms(s, 4, 5) for s in SEEDS]
    seen, raw = env.reset(), plain.reset()
    task = 0
    for t in range(steps // E):
        for p in range(P):
            for e in range(E):
                assert np.array_equal(seen[p, e], [raw[p, e, perms[p][task][i]] for i in range(4)])
        result, raw_result = env.step(actions_at(t)), plain.step(actions_at(t))
        for p in range(P):
            for e in range(E):
                old = perms[p][task]
                assert np.array_equal(result.obs[p, e], raw_result.obs[p, e][old])  # the transition's own task
        assert np.array_equal(result.reward, raw_result.reward)
        assert np.array_equal(result.terminated | result.truncated, raw_result.terminated | raw_result.truncated)
        task = min((t + 1) * E, total - 1) // every
        assert env.shift.task == task and env.shift.metrics()["shift/task"] == task
        seen, raw = result.next_obs, raw_result.next_obs
    assert env.shift.switch_step == 24
    assert [r for r, _ in sum(env.take_episodes(), [])] == [r for r, _ in sum(plain.take_episodes(), [])]


@pytest.mark.parametrize("together", [True, False])
def test_permute_actions_steps_the_environment_with_perm_of_the_action(together):
    env, plain = env_pair("permute_actions", 4, 100, together)
    perms = [expected_perms(s, 2, 10) for s in SEEDS]
    assert all(any(perm[0] == 1 for perm in member) for member in perms)  # tasks that swap the two actions
    assert np.array_equal(env.reset(), plain.reset())  # observations as they are
    for t in range(20):
        task = t * E // 4
        chosen = actions_at(t)
        received = np.array([[perms[p][task][chosen[p, e]] for e in range(E)] for p in range(P)])
        result, raw_result = env.step(chosen), plain.step(received)
        for name in ("obs", "reward", "terminated", "truncated", "next_obs"):
            assert np.array_equal(getattr(result, name), getattr(raw_result, name)), (t, name)


def test_no_task_starts_at_the_budgets_last_step_and_every_beyond_it_is_the_identity():
    for every, total, tasks in ((10, 30, 3), (30, 30, 1), (1000, 30, 1)):
        shift = TaskShift(ShiftConfig(kind="permute_obs", every=every), [0], 4, total)
        seen = {0}
        for _ in range(total // 2):
            shift.advance(2)
            seen.add(shift.task)
        assert seen == set(range(tasks)), (every, total)
    assert np.array_equal(shift.perm, [np.arange(4)])


def test_a_vector_step_passing_several_multiples_draws_each_task():
    one = TaskShift(ShiftConfig(kind="permute_obs", every=2), [7], 5, 100)
    four = TaskShift(ShiftConfig(kind="permute_obs", every=2), [7], 5, 100)
    for _ in range(8):
        one.advance(1)
    four.advance(8)
    assert one.task == four.task == 4 and np.array_equal(one.perm, four.perm)
    assert np.array_equal(four.perm[0], expected_perms(7, 5, 5)[4])


def test_a_members_tasks_depend_on_its_seed_alone():
    cfg = ShiftConfig(kind="permute_obs", every=3)
    alone = TaskShift(cfg, [5], 8, 100)
    population = TaskShift(cfg, [4, 5, 6], 8, 100)
    for _ in range(10):
        alone.advance(2)
        population.advance(2)
        assert np.array_equal(population.perm[1], alone.perm[0])
    assert not np.array_equal(population.perm[0], population.perm[1])


def test_evaluations_view_reads_the_current_task_and_never_switches_it():
    cfg = EnvConfig(id="CartPole-v1", num_envs=3)
    shift = TaskShift(ShiftConfig(kind="permute_obs", every=1), SEEDS, 4, 100)
    shift.advance(5)
    evaluation = ShiftedEnv(PopulationEnv(cfg, SEEDS, purpose=3), shift, counts=False)
    raw = PopulationEnv(cfg, SEEDS, purpose=3)
    perm = shift.perm.copy()
    seen, obs = evaluation.reset(), raw.reset()
    for t in range(5):
        assert np.array_equal(seen, np.take_along_axis(obs, perm[:, None, :], axis=2))
        actions = np.full((P, 3), t % 2)
        seen, obs = evaluation.step(actions).next_obs, raw.step(actions).next_obs
    assert shift.steps == 5 and np.array_equal(shift.perm, perm)


def test_a_shifted_env_continues_from_its_state_exactly():
    whole, _ = env_pair("permute_obs", 4, 100, True)
    cut, _ = env_pair("permute_obs", 4, 100, True)
    for env in (whole, cut):
        env.reset()
    for t in range(7):
        whole.step(actions_at(t))
        cut.step(actions_at(t))
    from rlexp.run.checkpoint import split, stack

    own, shared = split(cut.state_dict(), P)  # through the checkpoint's own split (member files) and stack
    resumed, _ = env_pair("permute_obs", 4, 100, True)
    resumed.reset()
    resumed.load_state_dict(stack(own, shared))
    assert np.array_equal(resumed.observations(), whole.observations())
    for t in range(7, 20):
        a, b = whole.step(actions_at(t)), resumed.step(actions_at(t))
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.next_obs, b.next_obs), t
    assert resumed.shift.task == whole.shift.task == 10
