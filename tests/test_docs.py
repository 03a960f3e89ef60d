"""The user docs hold what they promise: no internal references in README.md or docs/, the README's snippet runs
against a real checkpoint, TensorBoard serves the tags the README names from a real run, and every tag the README
names for a script is one that a short real run of the script writes."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import torch

from tests.conftest import BASE_ENV, ROOT, run_script, scalars
from tests.test_doc_pages import SCRIPTS, page, real_run, tags_on_page, unwritten, written_tags

README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]


# ---- what users never see: no commit hashes, /tmp paths, internal files, or talk of "the issue" ----
def is_commit_hash(word: str) -> bool:
    """A word of 7-12 hex characters with both a digit and a letter (short and long forms of a git commit id)."""
    return (
        bool(re.fullmatch(r"[0-9a-fA-F]{7,12}", word)) and bool(re.search(r"\d", word)) and bool(re.search(r"[a-fA-F]", word))
    )


def internal_references(text: str) -> list:
    """(line number, what, line) for every commit hash, /tmp path, ../shared, REFERENCE.md or 'the issue'."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for word in re.findall(r"[0-9A-Za-z]+", line):
            if is_commit_hash(word):
                found.append((number, f"commit hash {word}", line))
        for pattern, what in (
            (r"/tmp\b", "/tmp path"),
            (r"\.\./shared", "../shared"),
            (r"REFERENCE\.md", "REFERENCE.md"),
            (r"(?i)\bthe issue\b", "'the issue'"),
        ):
            if re.search(pattern, line):
                found.append((number, what, line))
    return found


def test_the_grep_finds_what_it_must_and_nothing_else():
    bad = "built by 1c1a44c in /tmp/old_wt; see ../shared/REFERENCE.md, as the issue asks (a5baa0a, 2338119e)"
    kinds = [what for _, what, _ in internal_references(bad)]
    assert kinds == [
        "commit hash 1c1a44c",
        "commit hash a5baa0a",
        "commit hash 2338119e",
        "/tmp path",
        "../shared",
        "REFERENCE.md",
        "'the issue'",
    ]
    fine = "1M steps, 1,797 ± 23, seed 1234567, deadbeef, HalfCheetah-v4, ppo_atari.py, 1e-5, RMSprop, 100000 steps"
    assert internal_references(fine) == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_docs_hold_no_internal_references(path):
    found = internal_references(path.read_text())
    assert not found, "\n".join(f"{path.name}:{number}: {what}: {line}" for number, what, line in found)


# ---- no machine paths or development history in what is committed for users: docs, benchmarks/README.md, results ----
HISTORY = (
    (r"/(?:tmp|work|opt|home)/", "a path of the machine it ran on"),
    (r"(?i)\bissues? #?\d+", "an issue number"),
    (r"(?i)\bgates?\b", "'gate'"),
    (r"(?i)\b(?:first|second|third|fourth|fifth|last|this|that|rewrite's) stop\b", "a development 'stop'"),
    (r"(?i)\brounds? (?:so far|before)\b", "measurement 'rounds'"),
)
COMMITTED_FOR_USERS = [*DOCS, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "benchmarks" / "results").rglob("*.json"))]


def history_words(text: str) -> list:
    """(line number, what) for every machine path and word of the project's own making in the text."""
    return [
        (number, what)
        for number, line in enumerate(text.splitlines(), 1)
        for pattern, what in HISTORY
        if re.search(pattern, line)
    ]


def test_the_history_grep_finds_what_it_must_and_nothing_else():
    bad = "ran as /tmp/py_timed in /work/main for issue 45, under the gate, at the rewrite's first stop; rounds so far"
    assert [what for _, what in history_words(bad)] == [what for _, what in HISTORY]
    fine = "aggregate.py, speed_gate.py, the run stops with exit 3, Ctrl-C stop, ~/.ray/auth_token, $TMPDIR/x, rounding"
    assert history_words(fine) == []


@pytest.mark.parametrize("path", COMMITTED_FOR_USERS, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_docs_and_results_hold_no_machine_paths_or_history(path):
    found = history_words(path.read_text())
    assert not found, "\n".join(f"{path.relative_to(ROOT)}:{number}: {what}" for number, what in found)


def test_readme_is_short_and_links_only_what_exists():
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for target in re.findall(r"\]\(([^)#]+)\)", text):  # markdown links and images to files of this repository
        if "://" in target:
            continue
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"


def test_readme_results_table_is_the_one_the_jsons_give():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "summary.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_readme_commands_are_the_ci_command_and_a_ppo_run():
    """CI runs the README's test command verbatim (the default tier), then the README's slow tier and mutant run."""
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 ")]
    text = README.read_text()
    quick_start = text.split("## Quick start", 1)[1].split("##", 1)[0]
    commands = re.findall(r"^python3 -m pip install .*$", quick_start, re.M)
    later = ["uv run --all-extras pytest -m slow", "uv run --all-extras python -m tests.mutants --jobs 2"]
    assert ci == [commands[1], *(f"python3 -m {command}" for command in later)], "CI must run the README's test tiers"
    assert all(f"`{command}`" in text.split("## Tests", 1)[1] for command in later)
    assert re.search(r"uv run ppo_continuous\.py --env-id HalfCheetah-v4$", commands[0])


# ---- a real run, shared by the snippet, TensorBoard and tag tests (and test_doc_pages.py's tag tests) ----
@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """The session's short real ppo_continuous.py run (test_doc_pages.REAL_RUN_FLAGS: Pendulum, 256 steps,
    --save-model --keep-best --eval-episodes 1): its run folder, final checkpoint and final evaluation's return."""
    run_dir = real_run("ppo_continuous", tmp_path_factory)
    (checkpoint,) = (run_dir / "checkpoints").glob("final_*.pt")
    (eval_return,) = scalars(run_dir, "eval/episodic_return").values()
    return {"runs": run_dir.parent, "run_dir": run_dir, "checkpoint": checkpoint, "eval_return": eval_return}


def readme_snippet() -> str:
    """The python block of the README's 'Use a trained agent in your own code' paragraph."""
    section = README.read_text().split("**Use a trained agent in your own code.**", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_snippet_plays_the_episode_that_the_evaluation_plays(trained, tmp_path):
    """The README's snippet (the script's Policy, rebuilt from a checkpoint) plays the episode that the run's own
    evaluation, the one tools/agent.py eval plays too, played: the same return."""
    snippet = readme_snippet()
    assert len(snippet.splitlines()) <= 10, "the README promises a snippet of at most 10 lines"
    path_literal = re.search(r'"runs/[^"]+\.pt"', snippet)
    assert path_literal, "the snippet loads a checkpoint under runs/"
    code = snippet.replace(path_literal.group(0), repr(str(trained["checkpoint"])))
    # the script's own evaluation episode: seed + 10_000, the mean action clipped to the bounds, obs stats frozen
    code += """
import gymnasium as gym
import numpy as np
env = gym.make(ckpt["args"]["env_id"])
obs, _ = env.reset(seed=ckpt["args"]["seed"] + 10_000)
total, done = 0.0, False
while not done:
    obs, reward, terminated, truncated, _ = env.step(np.clip(act(obs), env.action_space.low, env.action_space.high))
    total, done = total + float(reward), terminated or truncated
print("RETURN", repr(total))
"""
    env = {**os.environ, **BASE_ENV, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    played = float(re.search(r"^RETURN (.+)$", proc.stdout, re.M).group(1))
    assert played == pytest.approx(trained["eval_return"], rel=1e-5, abs=1e-3)  # logged as float32


# ---- TensorBoard, started for real on the run ----
README_TAG = re.compile(r"`((?:charts|losses|eval)/[A-Za-z_]+)`")
# the tags every ppo_continuous.py run writes, as the README names them
PPO_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "eval/episodic_return",
    "charts/learning_rate",
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/grad_norm",
    "losses/explained_variance",
    "losses/approx_kl",
    "losses/clipfrac",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read().decode())


def poll(fetch, ready, timeout: float, what: str):
    """fetch() until ready(result), at most `timeout` seconds; connection errors count as not ready yet."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = fetch()
            if ready(last):
                return last
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as error:
            last = error
        time.sleep(0.5)
    raise AssertionError(
        f"TensorBoard: {what} not ready after {timeout:.0f} s (last answer: {last!r}); its log is "
        "tensorboard.log in the test's tmp_path"
    )


def test_readme_names_the_tags_a_run_writes():
    section = README.read_text().split("**TensorBoard**", 1)[1].split("\n\n", 1)[0]
    assert set(PPO_TAGS) <= set(README_TAG.findall(section))


# In the TensorBoard paragraph, a clause (between semicolons) that opens with one of these names those scripts' tags;
# every other tag in the README (that paragraph's "Every script logs ..." clause, the evaluation and keep-best
# paragraphs) is every script's.
README_FAMILIES = {
    "PPO and A2C": ("ppo_continuous", "ppo_atari", "a2c_atari"),
    "PPO also": ("ppo_continuous", "ppo_atari"),
    "SAC": ("sac_continuous", "sac_continuous_ray"),
}


def readme_tags_by_script(text: str) -> dict:
    """{script: the TensorBoard tags the README says it writes}."""
    paragraph = text.split("**TensorBoard**", 1)[1].split("\n\n", 1)[0]
    named = {script: set() for script in SCRIPTS}
    for clause in [text.replace(paragraph, ""), *paragraph.split(";")]:
        opening = next((o for o in README_FAMILIES if clause.lstrip().startswith(o)), None)
        for script in README_FAMILIES.get(opening, SCRIPTS):
            named[script] |= tags_on_page(clause)
    return named


def test_readme_says_which_scripts_write_which_tags():
    named = readme_tags_by_script(README.read_text())
    assert set(PPO_TAGS) | {"eval/best_return", "charts/best_training_return"} <= named["ppo_continuous"]
    assert {"losses/qf_loss", "losses/actor_loss", "losses/alpha"} <= named["sac_continuous_ray"]
    assert "losses/clipfrac" not in named["a2c_atari"] and "losses/policy_loss" not in named["sac_continuous"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_tag_the_readme_names_is_written_by_a_real_run(script, tmp_path_factory):
    """The README's tags for each script, against what the script's short real run (test_doc_pages.real_run) wrote.
    sac_continuous_ray's: against its page's tags, which test_doc_pages checks on a real Ray run in the suite's `ray`
    group (a Ray run here would run beside the other Ray tests)."""
    named = readme_tags_by_script(README.read_text())[script]
    if script == "sac_continuous_ray":
        written, where = tags_on_page(page(script)), "docs/sac_continuous_ray.md (checked on a real run)"
    else:
        written, where = written_tags(real_run(script, tmp_path_factory)), f"a real run of {script}.py"
    missing = unwritten(named, written)
    assert not missing, f"the README names tags for {script}.py that {where} does not have: {missing}"


def test_tensorboard_serves_the_documented_tags_of_a_real_run(trained, tmp_path):
    section = README.read_text().split("**TensorBoard**", 1)[1].split("\n\n", 1)[0]
    assert "tensorboard --logdir runs" in section
    port = free_port()
    tensorboard = Path(sys.executable).with_name("tensorboard")
    command = [str(tensorboard)] if tensorboard.exists() else [sys.executable, "-m", "tensorboard.main"]
    log = open(tmp_path / "tensorboard.log", "w")  # a file, not a pipe: an unread pipe could fill and stall the server
    server = subprocess.Popen(
        [*command, "--logdir", str(trained["runs"]), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        base = f"http://127.0.0.1:{port}/data/plugin/scalars"
        run = trained["run_dir"].name  # the run folder relative to --logdir
        tags = poll(
            lambda: get_json(f"{base}/tags"), lambda t: set(PPO_TAGS) <= set(t.get(run, {})), 120, f"the tags of run {run}"
        )
        assert set(PPO_TAGS) <= set(tags[run])
        for tag in PPO_TAGS:
            query = urllib.parse.urlencode({"run": run, "tag": tag})
            points = poll(lambda: get_json(f"{base}/scalars?{query}"), lambda p: len(p) > 0, 60, tag)
            logged = scalars(trained["run_dir"], tag)  # what the event files hold
            assert {step: value for _, step, value in points} == pytest.approx(logged), tag
        (point,) = get_json(f"{base}/scalars?{urllib.parse.urlencode({'run': run, 'tag': 'eval/episodic_return'})}")
        assert point[1] == 256 and point[2] == pytest.approx(trained["eval_return"])
    finally:
        os.kill(server.pid, signal.SIGTERM)  # the server this test started, by its pid
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=30)
        log.close()


def export_snippet() -> str:
    """The python block of the README's 'Share a trained agent' paragraph."""
    section = README.read_text().split("**Share a trained agent.**", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_export_snippet_plays_the_evaluation_episode_with_plain_torch(trained, tmp_path):
    """The README's export command (tools/agent.py export) on a trained checkpoint, then its snippet in a process that
    has no path to this repository: policy.pt2 alone plays the episode that the script's evaluation played."""
    section = README.read_text().split("**Share a trained agent.**", 1)[1].split("```", 1)[0]
    command = re.search(r"`uv run tools/agent\.py export (runs/<run>/checkpoints/step_<step>)\.pt`", section)
    assert command, "the paragraph shows the export command, on a checkpoint that a default run writes"
    assert "weights_only=True" in section and "unpickles" in section, "the paragraph says what loading policy.pt2 does"
    proc = run_script("tools/agent.py", "export", trained["checkpoint"], "--episodes", 1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    exported = Path(trained["checkpoint"]).parent.parent / "export" / Path(trained["checkpoint"]).stem  # the default
    snippet = export_snippet()
    assert 'torch.export.load("runs/<run>/export/step_<step>/policy.pt2")' in snippet
    assert "import ppo_continuous" not in snippet and "print(" in snippet  # it shows what it computed
    snippet = snippet.replace("runs/<run>/export/step_<step>", str(exported))
    seed = torch.load(trained["checkpoint"], weights_only=True)["args"]["seed"] + 10_000  # the evaluation's episode
    code = snippet.replace('"HalfCheetah-v4"', '"Pendulum-v1"').replace("seed=0", f"seed={seed}")
    code += '\nprint("RETURN", repr(total))\n'
    env = {k: v for k, v in {**os.environ, **BASE_ENV}.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    played = float(re.search(r"^RETURN (.+)$", proc.stdout, re.M).group(1))
    assert played == pytest.approx(trained["eval_return"], rel=1e-5, abs=1e-3)  # logged as float32


def test_readme_tests_section_names_test_files_that_exist():
    """Each claim of the README's "Tests" section names the test files that check it; each name must match a file."""
    section = README.read_text().split("## Tests", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"`(tests/[\w*]+\.py)`", section)
    assert len(names) >= 8, names
    for name in names:
        assert list(ROOT.glob(name)), f"the README's Tests section names {name}, which matches no file"
