"""The Atari preprocessing on the real ALE (Breakout), one step at a time, and random play on the training envs.
make_env (gymnasium's AtariPreprocessing, RecordEpisodeStatistics, ClipReward, FrameStackObservation) and the two
wrappers by hand (EpisodicLife, FireReset) are identical in ppo_atari.py and a2c_atari.py (shared block `atari`):
testing one tests both."""

import hashlib

import gymnasium as gym
import numpy as np
import pytest

ale_py = pytest.importorskip("ale_py")
import ppo_atari as P  # noqa: E402

GAME = "BreakoutNoFrameskip-v4"
gym.register_envs(ale_py)
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def base_env(**kwargs) -> gym.Env:
    return gym.make(
        GAME, obs_type="grayscale", frameskip=1, repeat_action_probability=0.0, max_num_frames_per_episode=108_000, **kwargs
    )


class ActionLog(gym.Wrapper):
    """Records every action that reaches the emulator, and every raw reward it pays."""

    def __init__(self, env):
        super().__init__(env)
        self.actions, self.rewards = [], []

    def step(self, action):
        self.actions.append(int(action))
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.rewards.append(float(reward))
        return obs, reward, terminated, truncated, info


def lives_after_noops(env: gym.Env, steps: int) -> int:
    env.reset(seed=0)
    for _ in range(steps):
        env.step(0)
    return env.unwrapped.ale.lives()


def test_fire_reset_presses_fire_and_launches_the_ball():
    log = ActionLog(base_env())
    env = P.FireReset(log)
    env.reset(seed=0)
    assert log.actions == [1]  # FIRE, right after the emulator's reset
    # Behaviour: with FIRE pressed, a NOOP-only agent misses the launched ball and loses a life; without it the ball
    # never leaves and the game idles with all 5 lives.
    assert lives_after_noops(P.FireReset(base_env()), 600) < 5
    assert lives_after_noops(base_env(), 600) == 5


def chain():
    """make_env's whole chain, with an ActionLog spliced in right under AtariPreprocessing (above the emulator)."""
    env = P.make_env(GAME, 0, False, "")()
    inner = env
    while not isinstance(inner, gym.wrappers.AtariPreprocessing):
        inner = inner.env
    inner.env = log = ActionLog(inner.env)
    return env, log, inner


def test_a_reset_takes_between_1_and_30_noops_then_fire():
    counts = set()
    for seed in range(8):
        env, log, _ = chain()
        env.reset(seed=seed)
        noops = len(log.actions) - 4  # then FIRE (FireReset), held for 4 frames
        assert 1 <= noops <= 30 and log.actions == [0] * noops + [1] * 4
        counts.add(noops)
    assert len(counts) > 1  # the start states differ


def test_a_step_repeats_the_action_4_frames_and_pools_the_last_two():
    """make_env's step: the action held for 4 emulator frames, the rewards summed, the observation the pixel-wise max
    of the last two frames, resized to 84x84 (area interpolation), newest in the stack's last slot."""
    import cv2

    env, log, preprocessing = chain()
    env.reset(seed=0)  # FIRE launched the ball
    for _ in range(20):  # 20 frames on: the ball in flight, the frames change from one to the next
        preprocessing.env.step(2)
    ale = env.unwrapped.ale
    state = ale.cloneState()
    frames, total = [], 0.0
    for _ in range(4):  # by hand: the same action 4 times on the emulator
        _, reward, *_ = preprocessing.env.step(3)
        frames.append(ale.getScreenGrayscale())
        total += reward
    ale.restoreState(state)
    del log.actions[:]
    stacked, *_ = env.step(3)
    assert log.actions == [3, 3, 3, 3] and sum(log.rewards[-4:]) == total
    pooled = cv2.resize(np.maximum(frames[2], frames[3]), (84, 84), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(stacked[-1], pooled)
    assert not np.array_equal(frames[2], frames[3])  # the max is a real pooling here, not a copy of one frame


def test_observations_rewards_and_ends_are_those_recorded_before_the_ram_speed_line_went():
    """make_env's whole chain, 400 steps of a fixed action sequence from a fixed seed (9 learning episodes end: lives
    lost), hashed: the frames, rewards and ends the agent sees. Recorded at 487f95d, where the emulator's env returned
    its RAM through a private attribute (`_obs_type`); make_env now asks for screens through gym.make's public
    obs_type, and the agent must see the same. A new ale-py / gymnasium / opencv may change the hash: check the frames
    by eye (or against the old chain) before recording a new one."""
    env = P.make_env(GAME, 0, False, "")()
    rng = np.random.default_rng(0)
    digest = hashlib.sha256()
    obs, _ = env.reset(seed=5)
    digest.update(obs.tobytes())
    ends = 0
    for _ in range(400):
        obs, reward, terminated, truncated, _ = env.step(int(rng.integers(4)))
        digest.update(obs.tobytes())
        digest.update(np.array([reward, terminated, truncated], np.float64).tobytes())
        if terminated or truncated:
            ends += 1
            obs, _ = env.reset()
            digest.update(obs.tobytes())
    assert ends == 9
    assert digest.hexdigest() == "3c4c8be396494b276d3fe8565dcd9ef7e77d9f60a336e47329e2173332e53af6"


def test_life_loss_ends_a_learning_episode_but_not_the_game_and_the_score_spans_all_lives():
    env, log, _ = chain()
    rng = np.random.default_rng(0)
    env.reset(seed=3)
    learning_episodes, games, agent_steps = 0, [], 0
    for _ in range(20_000):
        obs, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
        agent_steps += 1
        assert reward in (-1.0, 0.0, 1.0)  # ClipReward (Breakout pays 1, 4 and 7 points)
        if terminated or truncated:
            learning_episodes += 1
            if "episode" in info:
                games.append(info["episode"])
                break
            # a lost life only: the game goes on (no emulator reset: its frame counter keeps running)
            before = env.unwrapped.ale.getEpisodeFrameNumber()
            env.reset()
            assert env.unwrapped.ale.getEpisodeFrameNumber() > before and env.unwrapped.ale.lives() > 0
    assert learning_episodes == 5 and len(games) == 1  # five lives, one game
    assert games[0]["r"] == pytest.approx(sum(log.rewards))  # the unclipped score of all lives
    assert games[0]["r"] > 0
    # the length counts env steps: the agent's, the first FIRE and the NOOP + FIRE after each of the 4 lost lives
    # (RecordEpisodeStatistics sits under EpisodicLife and FireReset); not the frames (4 per step) nor the start's NOOPs
    assert games[0]["l"] == agent_steps + 1 + 2 * 4 and len(log.actions) > 4 * agent_steps


def test_clip_reward_keeps_only_the_sign():
    """gymnasium's ClipReward to [-1, 1] is sign(r) on whole points, which Atari pays."""
    env = P.make_env(GAME, 0, False, "")()
    while not isinstance(env, gym.wrappers.ClipReward):
        env = env.env
    assert [env.reward(r) for r in (7.0, 1.0, 0.0, -3.0)] == [1.0, 1.0, 0.0, -1.0]


def test_frame_stack_is_oldest_first_and_starts_full():
    env, _, _ = chain()
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert all(np.array_equal(obs[k], obs[3]) for k in range(3))  # after a reset: the first frame in every slot
    previous = obs
    for _ in range(8):  # the ball is in play (FIRE reset) and the paddle moves: every frame differs
        obs, *_ = env.step(3)
        np.testing.assert_array_equal(obs[:3], previous[1:])  # shifted by one: the newest frame is last
        previous = obs
    assert not np.array_equal(obs[3], obs[0])


@pytest.mark.parametrize("env_id", [GAME, "ALE/Pong-v5"])
def test_make_env_sets_the_108k_frame_limit_and_the_ids_sticky_actions(env_id):
    """make_env's own env: ALE truncates a game at 108,000 frames (30 minutes), for both id forms; v5's sticky
    actions (p=0.25) stay, v4 has none."""
    env = P.make_env(env_id, 0, False, "")()
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == 108_000
    assert env.unwrapped.ale.getFloat("repeat_action_probability") == P.parse_atari_id(env_id)[1]
    assert env.unwrapped._frameskip == 1  # AtariPreprocessing skips; no second skip underneath
    env.close()


def test_ids_map_to_game_and_sticky_actions_and_bad_ids_are_refused():
    assert P.parse_atari_id("BreakoutNoFrameskip-v4") == ("Breakout", 0.0)
    assert P.parse_atari_id("ALE/Pong-v5") == ("Pong", 0.25)
    for bad in ("HalfCheetah-v4", "Breakout-v4", "ALE/Breakout-v4"):
        with pytest.raises(P.UserError):
            P.parse_atari_id(bad)
    with pytest.raises(P.UserError, match="unknown Atari game"):
        P.check_atari_env("NoSuchGameNoFrameskip-v4")


RESET_STEPS = 1 + 2 * 4  # steps of a Breakout game's resets that its length counts: FIRE, then NOOP and FIRE per lost life


def test_random_play_scores_whole_games_and_counts_their_steps():
    """Random play on the training envs (2 envs, seed 1), checked against this test's own counters as it goes: the reset
    fills every frame-stack slot, rewards are clipped, a game's logged length is its agent steps and the steps its
    resets take (the first FIRE, a NOOP and a FIRE after each of 4 lost lives) and it ends on its 5th learning-episode
    end (Breakout's lives); its score is whole unclipped points."""
    envs = P.make_vector_env(P.Args(num_envs=2, async_envs=False), "")
    first, _ = envs.reset(seed=1)
    assert first.shape == (2, 4, 84, 84) and first.dtype == np.uint8
    assert all(np.array_equal(first[i, k], first[i, 3]) for i in range(2) for k in range(3))  # the first frame in every slot
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    rng = np.random.default_rng(0)
    agent_steps = np.zeros(2, int)  # real transitions since this env's last game over
    episode_ended = np.zeros(2, bool)
    ends_per_game, games = np.zeros(2, int), []
    for _ in range(6_000):
        obs, reward, terminated, truncated, infos = envs.step(rng.integers(0, 4, 2))
        assert obs.shape == (2, 4, 84, 84) and set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        agent_steps += ~episode_ended  # a reset step (after an episode end) is not the agent's step
        for i, score, length in P.finished_games(infos):
            games.append((score, length))
            assert length == agent_steps[i] + RESET_STEPS, (length, agent_steps[i])
            assert ends_per_game[i] + 1 == 5  # the game ended on its 5th learning-episode end
            agent_steps[i], ends_per_game[i] = 0, -1
        episode_ended = terminated | truncated
        ends_per_game += episode_ended
        if len(games) >= 3:
            break
    envs.close()
    assert len(games) >= 3 and all(score >= 0 and float(score).is_integer() for score, _ in games), games
    # a game's length beyond its points: each return of the ball scores a point and buys ~40 agent steps; the rest is
    # the ~23 steps a life's ball takes to fall past the paddle, 5 lives (frames counted as steps would give ~4x)
    assert all(80 <= length - RESET_STEPS - 40 * score <= 170 for score, length in games), games


def scripted_chain(events: dict):
    """make_env's statistics and reset wrappers on a scripted game, one frame per step (no AtariPreprocessing)."""
    from tests.fake_envs import ScriptedAle

    ale = ScriptedAle(events, lives=2)
    env = P.EpisodicLife(gym.wrappers.RecordEpisodeStatistics(ale))
    return P.FireReset(env), ale


# Emulator steps of the first game: 1 FIRE (FireReset), 2 and 3 the agent's, 3 loses a life; the reset step after it
# takes 4 NOOP (EpisodicLife) and 5 FIRE (FireReset).
LIFE_THEN_GAME_IN_NOOP = {2: (1.0, 2), 3: (5.0, 1), 4: (2.0, 0)}  # the game ends in the NOOP, with 2 points
LIFE_THEN_GAME_IN_FIRE = {2: (1.0, 2), 3: (5.0, 1), 4: (2.0, 1), 5: (3.0, 0)}  # ...in the FIRE, with 2 + 3 points
LIFE_THEN_POINTS_IN_FIRE = {2: (1.0, 2), 3: (5.0, 1), 4: (2.0, 1), 5: (3.0, 1), 6: (4.0, 0)}  # the agent's step ends it


@pytest.mark.parametrize(
    "events, score, length, step",
    [(LIFE_THEN_GAME_IN_NOOP, 8.0, 4, 3), (LIFE_THEN_GAME_IN_FIRE, 11.0, 5, 3), (LIFE_THEN_POINTS_IN_FIRE, 15.0, 6, 4)],
)
def test_a_game_that_ends_inside_a_reset_is_logged_as_its_own_game_with_the_points_of_the_reset_steps(
    events, score, length, step
):
    env, ale = scripted_chain(events)
    envs = gym.vector.SyncVectorEnv([lambda: env], autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    envs.reset(seed=0)
    games, step_of = [], []
    for t in range(1, 9):
        obs, _, terminated, _, infos = envs.step(np.array([2]))  # RIGHT: the agent's actions are 2s in the log
        games += [(ret, length) for _, ret, length in P.finished_games(infos)]
        step_of += [t] * len(P.finished_games(infos))
    # one game, all its points (the reset steps' too), its env steps (the resets' NOOP and FIRE included)
    assert games == [(score, length)]
    assert ale.actions[:3] == [1, 2, 2] and ale.actions[3:5] == [0, 1]  # FIRE; the reset step's NOOP, FIRE
    assert step_of == [step]  # a game that ends inside the reset step after the lost life: logged at that very step


def test_evaluation_counts_a_game_that_ends_inside_a_reset():
    env, _ = scripted_chain(LIFE_THEN_GAME_IN_FIRE)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    screens = gym.wrappers.TransformObservation(env, lambda obs: np.zeros((4, 84, 84), np.uint8), frames)
    # the first game ends inside the reset step after its lost life; the later games score 0
    assert P.evaluate(P.Policy(P.Agent(4)), screens, 2, 0) == [11.0, 0.0]


def test_evaluation_plays_whole_games_on_the_real_chain():
    """Breakout with a fixed untrained policy: whole games (5 lives each) end, with whole unclipped points."""
    returns = P.evaluate(P.Policy(P.Agent(4)), P.eval_env(GAME), 2, 10_001)
    assert len(returns) == 2 and all(r >= 0 and float(r).is_integer() for r in returns)
