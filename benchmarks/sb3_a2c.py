"""Stable-Baselines3's `A2C` on a NoFrameskip Atari game with its Atari set-up (16 envs, 5 steps, 4 stacked frames):
the reference benchmarks/speed_vs_reference.py times against a2c_atari.py, and the comparison runs of the results.
Run it with the reference environment's python (benchmarks/speed_vs_reference.py --setup builds it):

    REFERENCE_PYTHON benchmarks/sb3_a2c.py STEPS [--seed S] [--env-id ID] [--zoo] [--monitor-dir DIR]

Without --zoo the optimizer is torch's RMSprop (alpha 0.99, eps 1e-5); with --zoo rl-baselines3-zoo's Atari recipe,
RMSpropTFLike (alpha 0.99, eps 1e-5). Both with vf_coef 0.25, ent_coef 0.01 and SB3's other defaults (lr 7e-4).
--monitor-dir writes one monitor CSV per env (benchmarks/sb3_monitor.py turns them into a results JSON).
"""

import argparse

import torch
from stable_baselines3 import A2C
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
from stable_baselines3.common.vec_env import VecFrameStack

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
parser.add_argument("--zoo", action="store_true")
parser.add_argument("--monitor-dir", default=None)
args = parser.parse_args()

envs = VecFrameStack(make_atari_env(args.env_id, n_envs=16, seed=args.seed, monitor_dir=args.monitor_dir), n_stack=4)
optimizer = RMSpropTFLike if args.zoo else torch.optim.RMSprop
policy_kwargs = {"optimizer_class": optimizer, "optimizer_kwargs": {"alpha": 0.99, "eps": 1e-5, "weight_decay": 0}}
model = A2C("CnnPolicy", envs, seed=args.seed, device="cpu", vf_coef=0.25, ent_coef=0.01, policy_kwargs=policy_kwargs)
model.learn(args.steps)
