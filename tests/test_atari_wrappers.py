"""The Atari preprocessing on the real ALE (Breakout), one step at a time, and the two backends side by side.
make_env (gymnasium's AtariPreprocessing, RecordEpisodeStatistics, ClipReward, FrameStackObservation; shared block
`atari-make-env`) and the two wrappers by hand (EpisodicLife, FireReset; shared block `atari-wrappers`) are identical
in ppo_atari.py and a2c_atari.py: testing one tests both."""

import gymnasium as gym
import numpy as np
import pytest

ale_py = pytest.importorskip("ale_py")
import ppo_atari as P  # noqa: E402

GAME = "BreakoutNoFrameskip-v4"
gym.register_envs(ale_py)
ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)


def base_env(**kwargs) -> gym.Env:
    return gym.make(GAME, obs_type="grayscale", frameskip=1, repeat_action_probability=0.0,
                    max_num_frames_per_episode=P.MAX_FRAMES_PER_GAME, **kwargs)  # fmt: skip


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
        obs, reward, *_ = preprocessing.env.step(3)
        frames.append(obs)
        total += reward
    ale.restoreState(state)
    del log.actions[:]
    stacked, *_ = env.step(3)
    assert log.actions == [3, 3, 3, 3] and sum(log.rewards[-4:]) == total
    pooled = cv2.resize(np.maximum(frames[2], frames[3]), (84, 84), interpolation=cv2.INTER_AREA)
    np.testing.assert_array_equal(stacked[-1], pooled)
    assert not np.array_equal(frames[2], frames[3])  # the max is a real pooling here, not a copy of one frame


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
    assert env.unwrapped.ale.getInt("max_num_frames_per_episode") == P.MAX_FRAMES_PER_GAME == 108_000
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


BACKENDS = ("gymnasium", "ale-vector")
# Breakout's screen, 84x84 rows: the score and lives 2-5, the top wall 6-12, the bricks 22-37, the paddle 75-77. The
# ball flies in between (at a reset: rows 49-61 measured).
BALL_ROWS = range(38, 75)
RESET_STEPS = {"gymnasium": 1 + 2 * 4, "ale-vector": 4}  # steps of a Breakout game's resets that its length counts


def play_random_games(backend: str, games_wanted: int = 3) -> dict:
    """Random play on one backend (2 envs, seed 1), checked against this test's own counters as it goes: the reset
    fills every frame-stack slot, rewards are clipped, a game's logged length is its agent steps and the steps its
    resets take (gymnasium: the first FIRE, a NOOP and a FIRE after each of 4 lost lives; ale-vector: a FIRE step
    after each lost life) and it ends on its 5th learning-episode end (Breakout's lives). Returns the reset
    observation, the mean of the newest frames over the run, and the games' (score, length)."""
    envs = P.make_vector_env(P.Args(env_backend=backend, num_envs=2, async_envs=False, env_threads=1), "", seed=1)
    first, _ = envs.reset(seed=1)
    assert first.shape == (2, 4, 84, 84) and first.dtype == np.uint8
    assert all(np.array_equal(first[i, k], first[i, 3]) for i in range(2) for k in range(3))  # the first frame in every slot
    assert envs.metadata["autoreset_mode"] == gym.vector.AutoresetMode.NEXT_STEP
    rng = np.random.default_rng(0)
    screen_sum, frames = first[:, 3].astype(np.float64).sum(0), 2
    agent_steps = np.zeros(2, int)  # real transitions since this env's last game over
    episode_ended = np.zeros(2, bool)
    ends_per_game, games = np.zeros(2, int), []
    for _ in range(6_000):
        obs, reward, terminated, truncated, infos = envs.step(rng.integers(0, 4, 2))
        assert obs.shape == (2, 4, 84, 84) and set(np.unique(reward)) <= {-1.0, 0.0, 1.0}
        screen_sum, frames = screen_sum + obs[:, 3].sum(0), frames + 2
        agent_steps += ~episode_ended  # a reset step (after an episode end) is not the agent's step
        for i, score, length in P.finished_games(infos):
            games.append((score, length))
            assert length == agent_steps[i] + RESET_STEPS[backend], (backend, length, agent_steps[i])
            assert ends_per_game[i] + 1 == 5, backend  # the game ended on its 5th learning-episode end
            agent_steps[i], ends_per_game[i] = 0, -1
        episode_ended = terminated | truncated
        ends_per_game += episode_ended
        if len(games) >= games_wanted:
            break
    envs.close()
    assert len(games) >= games_wanted and all(score >= 0 and float(score).is_integer() for score, _ in games), games
    return {"first": first[:, 3].astype(int), "mean_screen": screen_sum / frames, "games": games}


def test_backends_agree_on_observations_and_game_statistics():
    """The gymnasium chain and ale-vector side by side, from the same seed with the same random actions. Equal where
    the docs say they are (docs/ppo_atari.md, "The ale-vector backend"): ALE's grayscale palette and OpenCV's area
    resize to 84x84 on both, so the reset screens (walls, bricks, score 0, 5 lives, paddle) are pixel for pixel the
    same; only the ball differs, as the library presses FIRE before its start NOOPs and the chain after them. The
    games then differ (other random streams), so over the run only statistics compare: the average screen, and a
    game's length against its score (both count agent steps and whole unclipped points)."""
    gym_run, ale_run = (play_random_games(backend) for backend in BACKENDS)
    # (1) the reset screens: identical but for at most two (max-pooled) balls, in the rows the ball flies in
    differ = gym_run["first"] != ale_run["first"]
    for i in range(2):
        rows = np.flatnonzero(differ[i].any(axis=1))
        assert differ[i].sum() <= 24 and set(rows) <= set(BALL_ROWS), (i, differ[i].sum(), rows)
        # not a vacuous match: the screen has content, and a mirrored one would be far off (~300 pixels)
        assert len(np.unique(gym_run["first"][i])) > 10
        assert (gym_run["first"][i] != ale_run["first"][i][:, ::-1]).sum() > 100
    # (2) the average screen over the run: within 1 gray level per pixel on average (measured 0.3: other bricks hit,
    # other scores, the paddle elsewhere; mirrored left-right ~3, upside down ~60)
    assert np.abs(gym_run["mean_screen"] - ale_run["mean_screen"]).mean() < 1.0
    # (3) a game's length beyond its points: a random player returns the ball now and then, each return scores a
    # point and buys ~40 agent steps; the rest is the ~23 steps a life's ball takes to fall past the paddle, 5 lives
    # (measured 101-137 agent steps per game on both backends). Frames counted as steps would give ~4x; lives as
    # games ~1/5. The steps the resets take (RESET_STEPS) are left out to compare.
    base = {name: [length - RESET_STEPS[name] - 40 * score for score, length in run["games"]]
            for name, run in zip(BACKENDS, (gym_run, ale_run))}  # fmt: skip
    assert all(80 <= b <= 170 for bs in base.values() for b in bs), base
    assert abs(np.mean(base["gymnasium"]) - np.mean(base["ale-vector"])) <= 25, base


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
        games += [(r, l) for _, r, l in P.finished_games(infos)]
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


def test_ale_vector_scores_whole_games_unclipped_and_presses_fire_after_a_lost_life():
    """Space Invaders pays 5 to 30 points an alien: the logged score must be the sum of the library's unclipped
    rewards (FIRE steps included), the learning rewards their signs."""
    args = P.Args(env_id="SpaceInvadersNoFrameskip-v4", env_backend="ale-vector", num_envs=2)
    envs = P.make_vector_env(args, "", seed=3)
    sent = []  # (actions the library got, its unclipped rewards) per step
    library_step = envs.envs.step

    def spy(actions):
        result = library_step(actions)
        sent.append((actions.copy(), result[1].copy()))
        return result

    envs.envs.step = spy
    envs.reset()
    rng = np.random.default_rng(0)
    unclipped, games, after_life, life_restarts = np.zeros(2), [], np.zeros(2, bool), 0
    for _ in range(3_000):
        actions = rng.integers(0, 6, 2)
        obs, reward, terminated, truncated, infos = envs.step(actions)
        library_actions, library_reward = sent[-1]
        np.testing.assert_array_equal(library_actions, np.where(after_life, 1, actions))  # FIRE in place of the agent's
        for i in np.flatnonzero(after_life):  # the reset step after a lost life: the first frame in every slot
            assert all(np.array_equal(obs[i, k], obs[i, 3]) for k in range(3))
        life_restarts += after_life.sum()
        np.testing.assert_array_equal(reward, np.sign(library_reward))
        unclipped += library_reward
        ended = np.zeros(2, bool)
        for i, score, length in P.finished_games(infos):
            games.append(score)
            assert score == unclipped[i]
            unclipped[i], ended[i] = 0.0, True
        after_life = terminated & ~ended
        if len(games) >= 2:
            break
    envs.close()
    assert len(games) >= 2 and life_restarts >= 2 and max(games) > 30  # whole games, points above 1 per reward


@pytest.mark.parametrize("env_id, actions, fire", [("ALE/MsPacman-v5", 9, 0), ("PongNoFrameskip-v4", 6, 1)])
def test_ale_vector_finds_the_rom_of_both_id_forms(env_id, actions, fire):
    # "MsPacman" is the ROM "ms_pacman"; a game without FIRE restarts a lost life with NOOP (action 0)
    envs = P.make_vector_env(P.Args(env_id=env_id, env_backend="ale-vector", num_envs=1), "", seed=1)
    assert envs.single_action_space.n == actions and envs.restart_action == fire
    envs.close()


def test_ale_vector_is_repeatable_from_its_seed():
    def play(seed: int) -> list:
        envs = P.make_vector_env(P.Args(env_backend="ale-vector", num_envs=2, env_threads=2), "", seed=seed)
        obs, _ = envs.reset(seed=seed)
        rng, trace = np.random.default_rng(0), [obs.sum()]
        for _ in range(300):
            obs, reward, terminated, truncated, _ = envs.step(rng.integers(0, 4, 2))
            trace.append((obs.sum(), *reward, *terminated, *truncated))
        envs.close()
        return trace

    assert play(5) == play(5) != play(6)  # the same games from the same seed (NOOP starts, emulator), others from another
