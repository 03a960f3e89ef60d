"""A synthetic pixel task for the Atari learning tests: what the scripts' preprocessing hands the agent, from an env
that learns in a few thousand steps.

PixelTarget: observations are (4, 84, 84) uint8 frame stacks, oldest frame first, as make_env's FrameStack gives
them; 4 actions. Each frame shows one bright square in one of the 4 quadrants (at a random place inside it), drawn
anew at every step; the action numbered as the quadrant in the newest frame earns +1, any other 0. The older frames
show the earlier targets, so the agent must read the newest one. Episodes end (terminated) after `length` steps: a
random policy scores length / 4, a perfect one `length`. At an episode's last step info["episode"] = {"r", "l"}, as
the scripts' GameStatistics reports a game (a vector env gathers it into infos["episode"] and infos["_episode"]).
"""

from typing import Optional

import gymnasium as gym
import numpy as np

SIZE, SQUARE = 84, 16  # frame side; square side (a quadrant is 42 pixels wide)
QUADRANTS = [(0, 0), (0, SIZE // 2), (SIZE // 2, 0), (SIZE // 2, SIZE // 2)]  # (row, col) of each quadrant's corner


class PixelTarget(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, length: int = 20, stack: int = 4):
        self.observation_space = gym.spaces.Box(0, 255, (stack, SIZE, SIZE), np.uint8)
        self.action_space = gym.spaces.Discrete(len(QUADRANTS))
        self.length = length
        self.frames = np.zeros((stack, SIZE, SIZE), np.uint8)
        self.target, self.t, self.score = 0, 0, 0.0

    def draw(self) -> np.ndarray:
        """A new target, drawn into a new frame; returns the frame."""
        self.target = int(self.np_random.integers(len(QUADRANTS)))
        row, col = QUADRANTS[self.target]
        dr, dc = self.np_random.integers(0, SIZE // 2 - SQUARE + 1, size=2)
        frame = np.zeros((SIZE, SIZE), np.uint8)
        frame[row + dr : row + dr + SQUARE, col + dc : col + dc + SQUARE] = 255
        return frame

    def reset(self, *, seed: Optional[int] = None, options: Optional[dict] = None):
        super().reset(seed=seed)
        self.t, self.score = 0, 0.0
        self.frames[:] = self.draw()  # after a reset every slot holds the first frame, as FrameStack
        return self.frames.copy(), {}

    def step(self, action):
        reward = 1.0 if int(action) == self.target else 0.0
        self.t += 1
        self.score += reward
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = self.draw()
        terminated = self.t >= self.length
        info = {"episode": {"r": self.score, "l": self.t}} if terminated else {}
        return self.frames.copy(), reward, terminated, False, info


def make_vector_env(num_envs: int, length: int = 20, env_class: type = PixelTarget) -> gym.vector.SyncVectorEnv:
    """num_envs PixelTarget envs (or of a subclass) under next-step autoreset, the mode the scripts' loops assume."""
    return gym.vector.SyncVectorEnv(
        [lambda: env_class(length) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
    )
