"""`python <script> --help` reads as one page in one voice: after tyro's usage line, one line that says
what the script does, then where the other modes are (--resume, and tools/agent.py for eval / export); every flag
has short help that says what it does, shows one default, and none keeps the phrasing inherited from CleanRL
("Toggles ...", "if toggled", "the K epochs", "whether to"). A flag that several scripts have reads the same in each,
except where the scripts differ (listed in MAY_DIFFER). One --help per script (about 3 s each) and test process."""

import functools
import re

import pytest

from tests.conftest import run_script

SCRIPTS = {  # script: the algorithm its summary names
    "ppo_continuous": "PPO",
    "ppo_atari": "PPO",
    "a2c_atari": "A2C",
    "sac_continuous": "SAC",
    "sac_continuous_ray": "SAC",
}
MODES = ("--resume CKPT", "tools/agent.py eval|export CKPT")
BANNED = ("toggle", "if toggled", "the k epochs", "whether to")  # matched case-insensitively
# Flags several scripts have whose help says what differs between them (the unit of a step, where the learner runs,
# what a video records, ...); every other shared flag must read the same in each script.
MAY_DIFFER = {
    "--env-id",
    "--total-timesteps",
    "--learning-rate",
    "--num-envs",
    "--num-steps",
    "--norm-adv",
    "--cuda",
    "--torch-threads",
    "--capture-video",
    "--save-buffer",
    "--resume",
    "--eval-episodes",
    "--eval-interval",
    "--buffer-size",
    "--log-interval",
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")
BOX_EDGE = "│|"  # tyro draws the options box with these (UTF-8 or ASCII)


@functools.cache  # per script, on the first test that asks (xdist spreads the tests over its workers)
def run_help(script: str) -> str:
    """The script's --help output, ANSI codes removed, 200 columns wide."""
    proc = run_script(f"{script}.py", "--help", timeout=120, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert proc.returncode == 0, f"{script} --help: {proc.stderr}"
    return ANSI.sub("", proc.stdout)


def flags_help(text: str) -> dict:
    """{--flag: its help text} from the options box: an entry starts with its flag(s), its help follows on the same
    line after two or more spaces and on the indented lines below."""
    entries, current = {}, None
    for line in text.splitlines():
        inner = line.strip()
        if not (inner[:1] in BOX_EDGE and inner[-1:] in BOX_EDGE and len(inner) > 1):
            continue  # a box edge, or outside the box
        content, inner = inner[1:-1], inner[1:-1].strip()
        if content.startswith(" -"):  # an entry; its help's wrapped lines are indented under the help column
            invocation, *help_text = re.split(r"\s{2,}", inner, maxsplit=1)
            flag = next(word for word in re.split(r"[ ,]+", invocation) if word.startswith("--"))
            current = entries.setdefault(flag, [])
            current.extend(help_text)
        elif current is not None and inner:
            current.append(inner)
    return {flag: " ".join(part for part in parts if part) for flag, parts in entries.items() if flag != "--help"}


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_starts_with_what_the_script_does_and_where_the_modes_are(script):
    lines = [line.rstrip() for line in run_help(script).splitlines()]
    assert lines[0].startswith("usage:"), lines[0]
    top = [line for line in lines[1:] if line.strip()]
    summary = top[0]
    assert summary.startswith(SCRIPTS[script] + " "), f"{script}: the first line names the algorithm: {summary!r}"
    assert summary.endswith("trains an agent and logs to TensorBoard."), summary
    head = " ".join(top[1:4])  # the lines under the summary, above the options box
    for mode in MODES:
        assert mode in head, f"{script}: {mode} is not named under the summary:\n{head}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_flag_has_help_in_one_voice(script):
    flags = flags_help(run_help(script))
    assert len(flags) > 30, f"{script}: the options box was not read ({len(flags)} flags)"
    problems = []
    for flag, text in flags.items():
        described = text.split("(default:", 1)[0].strip()
        if not described:
            problems.append(f"{flag}: no help")
            continue
        if text.count("(default:") > 1:
            problems.append(f"{flag}: two defaults: {text}")
        if not next(c for c in described if c.isalpha()).islower():
            problems.append(f"{flag}: help must start lower-case: {text}")
        problems += [f"{flag}: {phrase!r} in {text!r}" for phrase in BANNED if phrase in text.lower()]
    assert not problems, f"{script}:\n" + "\n".join(problems)


@pytest.mark.parametrize("script", [s for s in SCRIPTS if SCRIPTS[s] in ("PPO", "A2C")])
def test_num_minibatches_says_it_divides_the_batch(script):
    flags = flags_help(run_help(script))
    if "--num-minibatches" not in flags:  # A2C updates on the whole batch
        assert script == "a2c_atari"
        return
    assert "must divide the batch (num_envs * num_steps)" in flags["--num-minibatches"], flags["--num-minibatches"]


def test_a_flag_reads_the_same_in_every_script_that_has_it():
    texts = {}
    for script in SCRIPTS:
        for flag, text in flags_help(run_help(script)).items():
            texts.setdefault(flag, {})[script] = text.split("(default:", 1)[0].strip()
    differ = {flag: by_script for flag, by_script in texts.items() if len(set(by_script.values())) > 1}
    unexpected = {flag: by_script for flag, by_script in differ.items() if flag not in MAY_DIFFER}
    assert not unexpected, "\n".join(f"{flag}: {by_script}" for flag, by_script in unexpected.items())
