"""Tiny deterministic environments for the tests: episode boundaries whose every step is known in advance.

Use them by id from a script run in the repository root, e.g. `--env-id tests.fake_envs:Counting-v0`
(gymnasium imports the module named before the colon, which registers the ids below).
"""

from typing import Optional

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env):
    """obs = [t, episode index] with t the step within the episode; reward 1 per step.
    Terminates after `terminate_at` steps (if given); the TimeLimit from registration truncates otherwise."""

    metadata = {"render_modes": []}

    def __init__(self, terminate_at: Optional[int] = None):
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.terminate_at = terminate_at
        self.t, self.episode = 0, -1

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t, self.episode = 0, self.episode + 1
        return np.array([self.t, self.episode], np.float64), {}

    def step(self, action):
        self.t += 1
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        return np.array([self.t, self.episode], np.float64), 1.0, terminated, False, {}


gym.register("Counting-v0", entry_point=CountingEnv, max_episode_steps=7)  # truncated at 7 steps
gym.register("CountingTerminates-v0", entry_point=CountingEnv, max_episode_steps=50, kwargs={"terminate_at": 5})
gym.register("DiscreteCounting-v0", entry_point=lambda: DiscreteCountingEnv(), max_episode_steps=7)


class DiscreteCountingEnv(CountingEnv):
    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Discrete(2)


class ScriptedAle(gym.Env):
    """A stand-in for ale-py's AtariEnv whose game is a script: `events[t] = (reward, lives after)` for the t-th
    emulator step of the first game (t from 1; absent: reward 0, no life lost); the later games earn nothing and
    end at their 20th step. A game is over when its lives reach 0.
    obs = [t, game index]; actions NOOP, FIRE, RIGHT, LEFT; every action taken is kept in `actions`."""

    metadata = {"render_modes": []}

    def __init__(self, events: dict, lives: int = 2):
        self.observation_space = gym.spaces.Box(0, np.inf, (2,), np.float64)
        self.action_space = gym.spaces.Discrete(4)
        self.events, self.start_lives = events, lives
        self.ale = self  # the wrappers read lives() and game_over() from env.unwrapped.ale
        self.t, self.game, self.life_count, self.actions = 0, -1, lives, []

    def get_action_meanings(self) -> list:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def lives(self) -> int:
        return self.life_count

    def game_over(self) -> bool:
        return self.life_count == 0

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t, self.game, self.life_count = 0, self.game + 1, self.start_lives
        return np.array([self.t, self.game], np.float64), {"lives": self.life_count}

    def step(self, action):
        self.actions.append(int(action))
        self.t += 1
        script = self.events if self.game == 0 else {20: (0.0, 0)}
        reward, self.life_count = script.get(self.t, (0.0, self.life_count))
        obs = np.array([self.t, self.game], np.float64)
        return obs, reward, self.game_over(), False, {"lives": self.life_count}


class FallingReturnEnv(CountingEnv):
    """CountingEnv whose reward falls to 0 from its 7th episode on (whatever the actions): the training return of
    an agent "collapses" at a step known in advance, for --keep-best."""

    def step(self, action):
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 1.0 if self.episode < 6 else 0.0, terminated, truncated, info


gym.register("FallingReturn-v0", entry_point=FallingReturnEnv, max_episode_steps=7)  # 7 steps: return 7, later 0


class NonFiniteAfter(CountingEnv):
    """CountingEnv whose `bad`-th step in this process (counted across episodes, not restored by a resume) returns
    NaN in its reward ("reward") or its observation ("obs"): a user's environment going wrong mid-run."""

    def __init__(self, bad: int, what: str):
        super().__init__()
        self.bad, self.what, self.calls = bad, what, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self.calls += 1
        if self.calls == self.bad:
            reward, obs = (np.nan, obs) if self.what == "reward" else (reward, np.array([np.nan, obs[1]]))
        return obs, reward, terminated, truncated, info


gym.register("NanReward-v0", entry_point=NonFiniteAfter, max_episode_steps=7, kwargs={"bad": 300, "what": "reward"})
gym.register("NanObservation-v0", entry_point=NonFiniteAfter, max_episode_steps=7, kwargs={"bad": 300, "what": "obs"})


class WiringEnv(CountingEnv):
    """CountingEnv with a reward that tells steps apart, r = t + episode / 10 (t counted from 1), whose odd
    episodes terminate at their 3rd step and whose even ones are truncated by the time limit at the 4th: a rollout
    of a few steps holds both kinds of episode end, each at a step known in advance (tests/test_wiring.py)."""

    def step(self, action):
        self.t += 1
        terminated = self.episode % 2 == 1 and self.t == 3
        return np.array([self.t, self.episode], np.float64), self.t + self.episode / 10, terminated, False, {}


gym.register("Wiring-v0", entry_point=WiringEnv, max_episode_steps=4)


class WiringAle(gym.Env):
    """A stand-in for ale-py's AtariEnv under make_env's EpisodicLife and FireReset (tests/test_wiring.py): games
    whose every step is known in advance, different in each env (`idx`, the env's index in the vector env).
    obs = [t, game] (uint8), t the emulator step within the game (the FIRE and NOOP steps of the resets count);
    reward t + game / 10. Even games: 2 lives, a life lost at t = 3 + idx, the game over at t = 7 + idx. Odd games:
    cut by the time limit at t = 5 + idx (truncated, lives left), as ALE's max_num_frames_per_episode cuts a game."""

    metadata = {"render_modes": []}

    def __init__(self, idx: int = 0):
        self.observation_space = gym.spaces.Box(0, 255, (2,), np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.idx, self.ale = idx, self  # the wrappers read lives() from env.unwrapped.ale
        self.t, self.game, self.life_count = 0, -1, 2

    def event(self, game: int, t: int) -> Optional[str]:
        """What emulator step t of game `game` brings: 'life' (one lost, lives left), 'game over', 'time limit'."""
        if game % 2 == 0:
            return {3 + self.idx: "life", 7 + self.idx: "game over"}.get(t)
        return "time limit" if t == 5 + self.idx else None

    def get_action_meanings(self) -> list:
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def lives(self) -> int:
        return self.life_count

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t, self.game, self.life_count = 0, self.game + 1, 2
        return np.array([self.t, self.game], np.uint8), {}

    def step(self, action):
        self.t += 1
        event = self.event(self.game, self.t)
        self.life_count -= {"life": 1, "game over": self.life_count}.get(event, 0)
        obs = np.array([self.t, self.game], np.uint8)
        return obs, self.t + self.game / 10, event == "game over", event == "time limit", {}


class WiringBoundsEnv(WiringEnv):
    """WiringEnv whose actions lie in [0.5, 3]: an action outside these bounds, or one drawn in [-1, 1] as if every
    Box were symmetric, shows (tests/test_update_wiring.py)."""

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(0.5, 3.0, (1,), np.float32)


gym.register("WiringBounds-v0", entry_point=WiringBoundsEnv, max_episode_steps=4)
