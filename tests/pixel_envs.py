"""A synthetic pixel task for the Atari learning tests: what the scripts' preprocessing hands the agent, from an env
that learns in a few thousand steps.

PixelTarget: observations are (4, 84, 84) uint8 frame stacks, oldest frame first, as make_env's FrameStack gives
them; 4 actions. Each frame shows one bright square in one of the 4 quadrants (at a random place inside it), drawn
anew at every step; the action numbered as the quadrant in the newest frame earns +1, any other 0. The older frames
show the earlier targets, so the agent must read the newest one. Episodes end (terminated) after `length` steps: a
random policy scores length / 4, a perfect one `length`. At an episode's last step info["episode"] = {"r", "l"}, as
the scripts' GameStatistics reports a game (a vector env gathers it into infos["episode"] and infos["_episode"]).

PixelTarget(delay=k), k >= 1: the action at step t is still judged against the target shown at step t, but its +1 is
paid k steps later, with the reward of step t + k (the last k actions of an episode are never paid: a random policy
scores (length - k) / 4, a perfect one length - k). The game shows what it will pay, as a ball in flight does in Pong:
the frame drawn after a right action has a grey background (LIT) instead of a black one, so with k <= stack the frame
stack holds every reward still to come and V(s) can know it. Credit for an action then reaches it only through the
rewards k steps on, or through V of a later state: where a rollout ends before the reward is paid, only through the
bootstrap V(s_T) of the rollout's end (tests/test_atari_learning.py drops it in a copy of each script).
"""

from typing import Optional

import gymnasium as gym
import numpy as np

SIZE, SQUARE = 84, 16  # frame side; square side (a quadrant is 42 pixels wide)
LIT = 64  # background of the frame drawn after a right action, with delay >= 1 (the target square is 255)
QUADRANTS = [(0, 0), (0, SIZE // 2), (SIZE // 2, 0), (SIZE // 2, SIZE // 2)]  # (row, col) of each quadrant's corner


class PixelTarget(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 20, stack: int = 4, delay: int = 0):
        assert 0 <= delay <= stack, "a reward still to come is shown by one of the stacked frames: delay <= stack"
        self.observation_space = gym.spaces.Box(0, 255, (stack, SIZE, SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(len(QUADRANTS))
        self.length, self.delay = length, delay
        self.unpaid = []  # with delay >= 1: the rewards earned by the last `delay` actions, oldest first
        self.frames = np.zeros((stack, SIZE, SIZE), np.uint8)
        self.target, self.t, self.score = 0, 0, 0.0

    def draw(self, lit: bool = False) -> np.ndarray:
        """A new target, drawn into a new frame (on a LIT background if `lit`); returns the frame."""
        self.target = int(self.np_random.integers(len(QUADRANTS)))
        row, col = QUADRANTS[self.target]
        dr, dc = self.np_random.integers(0, SIZE // 2 - SQUARE + 1, size=2)
        frame = np.full((SIZE, SIZE), LIT if lit else 0, np.uint8)
        frame[row + dr : row + dr + SQUARE, col + dc : col + dc + SQUARE] = 255
        return frame

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t, self.score, self.unpaid = 0, 0.0, []
        self.frames[:] = self.draw()  # after a reset every slot holds the first frame, as FrameStack
        return self.frames.copy(), {}

    def step(self, action):
        earned = 1.0 if int(action) == self.target else 0.0
        self.unpaid.append(earned)
        reward = self.unpaid.pop(0) if len(self.unpaid) > self.delay else 0.0  # delay 0: the reward earned now
        self.t += 1
        self.score += reward
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = self.draw(lit=self.delay > 0 and earned > 0)
        terminated = self.t >= self.length
        info = {"episode": {"r": self.score, "l": self.t}} if terminated else {}
        return self.frames.copy(), reward, terminated, False, info


def make_vector_env(
    num_envs: int, length: int = 20, env_class: type = PixelTarget, delay: int = 0
) -> gym.vector.SyncVectorEnv:
    """num_envs PixelTarget envs (or of a subclass) under next-step autoreset, the mode the scripts' loops assume."""
    return gym.vector.SyncVectorEnv(
        [lambda: env_class(length, delay=delay) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
