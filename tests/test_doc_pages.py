"""The doc pages in docs/ hold what the scripts hold: every function or class an "Implementation details" list
names exists in that script, every flags table is the one the script's Args gives, and the TensorBoard tags a page
names are the tags a short real run of the script writes, both ways. Each check is also shown to fail on a wrong page
(the *_catches_* tests)."""

import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from tests.conftest import ROOT, only_run_dir, run_script

SCRIPTS = ("ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray")


def load_generator():
    spec = importlib.util.spec_from_file_location("flags_tables", ROOT / "docs" / "flags_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(script: str) -> str:
    return (ROOT / "docs" / f"{script}.md").read_text()


def source(script: str) -> str:
    return (ROOT / f"{script}.py").read_text()


def test_every_script_has_a_page_and_the_generator_covers_them_all():
    assert tuple(load_generator().SCRIPTS) == SCRIPTS
    for script in SCRIPTS:
        assert (ROOT / "docs" / f"{script}.md").is_file(), f"docs/{script}.md is missing"


# ---- (1) the names in "Implementation details" exist in the script ----
CALL = re.compile(r"(?:(?P<cls>[A-Z]\w*)\.)?(?P<name>[A-Za-z_]\w*)\(\)")  # `name()` or `Class.method()`
CLASS = re.compile(r"[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*")  # `Name`: CamelCase, at least one lower-case letter
NOT_NAMES = {"True", "False", "None"}


def defined_names(text: str) -> tuple[set, set, dict]:
    """(top-level functions, top-level classes, {class: its methods}) of a script, read with ast."""
    functions, classes, methods = set(), set(), {}
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
        elif isinstance(node, ast.ClassDef):
            classes.add(node.name)
            methods[node.name] = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(node, ast.Assign):  # a library's class under the script's name: `RunningMeanStd = gym...`
            classes |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id[:1].isupper()}
    return functions, classes, methods


def section(text: str, title: str) -> str:
    """The body of the first heading containing `title`, up to the next heading of the same or a higher level."""
    match = re.search(rf"^(#+)[^\n]*{re.escape(title)}[^\n]*$", text, re.M | re.I)
    assert match, f"no heading '{title}'"
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def named_in_details(text: str) -> list:
    """Every `name()`, `Class.method()` and `Name` in backticks in the page's Implementation details section."""
    return [
        span
        for span in re.findall(r"`([^`\n]+)`", section(text, "Implementation details"))
        if (CALL.fullmatch(span) or CLASS.fullmatch(span)) and span not in NOT_NAMES
    ]


def missing_names(text: str, script_source: str) -> list:
    functions, classes, methods = defined_names(script_source)
    all_methods = set().union(*methods.values()) if methods else set()
    missing = []
    for span in named_in_details(text):
        call = CALL.fullmatch(span)
        if call and call["cls"]:
            ok = call["name"] in methods.get(call["cls"], set())
        elif call:
            ok = call["name"] in functions or call["name"] in all_methods
        else:
            ok = span in classes
        if not ok:
            missing.append(span)
    return missing


@pytest.mark.parametrize("script", SCRIPTS)
def test_implementation_details_name_only_what_the_script_defines(script):
    assert len(named_in_details(page(script))) >= 10, "the list should name the functions its details live in"
    missing = missing_names(page(script), source(script))
    assert not missing, f"docs/{script}.md names what {script}.py does not define: {missing}"


def test_the_name_check_catches_a_wrong_name():
    script = source("ppo_continuous")
    text = "## Implementation details\n1. `compute_gae_lambda()`, `RunningMeanVar`, `Agent.value()`, `compute_gae()`\n"
    text += "2. `Agent()` (a class called as a function), `Compute` (no such class), `compute_gae` and `nn.Linear`\n"
    text += "## Flags\n`not_checked_here()`\n"
    assert missing_names(text, script) == ["compute_gae_lambda()", "RunningMeanVar", "Agent.value()", "Agent()", "Compute"]
    wrong = page("ppo_continuous").replace("`compute_gae()`", "`compute_advantages()`")
    assert missing_names(wrong, script) == ["compute_advantages()"]


# ---- (2) the flags tables are generated from Args and up to date ----
def test_flags_tables_are_up_to_date():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "flags_tables.py"), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_table_lists_every_flag_and_no_derived_field(script):
    table = page(script).split("<!-- flags:begin -->", 1)[1].split("<!-- flags:end -->", 1)[0]
    flags = set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", table, re.M))
    cls = next(n for n in ast.parse(source(script)).body if isinstance(n, ast.ClassDef) and n.name == "Args")
    fields = {n.target.id: ast.unparse(n) for n in cls.body if isinstance(n, ast.AnnAssign)}
    expected = {"--" + name.replace("_", "-") for name, line in fields.items() if "init=False" not in line}
    assert flags == expected
    assert any("init=False" in line for line in fields.values()), "each script derives some fields; they must stay out"


def test_the_flags_check_catches_a_stale_table(tmp_path):
    generator = load_generator()
    (tmp_path / "docs").mkdir()
    for script in SCRIPTS:
        (tmp_path / f"{script}.py").write_text(source(script))
        (tmp_path / "docs" / f"{script}.md").write_text(page(script))
    check = [sys.executable, str(ROOT / "docs" / "flags_tables.py"), "--check", "--root", str(tmp_path)]
    assert subprocess.run(check, capture_output=True, text=True, timeout=120).returncode == 0
    # a default changed in the script, not in its page
    script = "ppo_continuous"
    (tmp_path / f"{script}.py").write_text(source(script).replace("clip_coef: float = 0.2", "clip_coef: float = 0.3"))
    assert generator.stale_pages(tmp_path) == [f"{script}.md"]
    proc = subprocess.run(check, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "docs/ppo_continuous.md" in proc.stderr
    # rewriting the page brings it up to date
    assert generator.write_pages(tmp_path) == [f"{script}.md"]
    assert "| `--clip-coef` | `float` | `0.3` |" in (tmp_path / "docs" / f"{script}.md").read_text()
    assert generator.stale_pages(tmp_path) == []
    # a page without its markers is stale, not silently skipped
    (tmp_path / "docs" / f"{script}.md").write_text(page(script).replace("<!-- flags:end -->", ""))
    assert generator.stale_pages(tmp_path)[0].startswith(f"{script}.md (")


def test_the_generator_reads_comments_docstrings_sections_and_leaves_out_derived_fields():
    generator = load_generator()
    text = '''
@dataclass
class Args:
    # --- algorithm ---
    lr: float = 3e-4  # the learning rate | with a pipe
    steps: int = 1_000  # how many "# not a comment" steps
    name: Optional[str] = None
    """a docstring
    over two lines"""

    # --- derived ---
    batch_size: int = field(init=False, default=0)  # not a flag
'''
    rows = generator.flag_rows(text)
    assert rows == [
        ("section", "algorithm"),
        ("flag", "--lr", "float", "3e-4", "the learning rate | with a pipe"),
        ("flag", "--steps", "int", "1_000", 'how many "# not a comment" steps'),
        ("flag", "--name", "Optional[str]", "None", "a docstring over two lines"),
    ]
    assert "the learning rate \\| with a pipe" in generator.markdown_table(rows)


# ---- (3) every TensorBoard tag a page names is one a real run of its script writes, and the converse ----
TAG = re.compile(r"(?<![/\w])((?:charts|losses|eval)/[A-Za-z0-9_<>]+)")  # not the eval/ in runs/<run>/eval/
GAME = "BreakoutNoFrameskip-v4"
# One short real run per script, enough to write every tag the script has: its first episodes end (the Atari runs
# play a few hundred agent steps per env: a random player's Breakout game lasts 116 or more) and learning starts;
# --save-model evaluates at the end (eval/episodic_return); --keep-best then logs eval/best_return (that final
# evaluation) and, with --eval-interval left at 0, charts/best_training_return (the training returns, at the end).
# SAC's --autotune, on by default, logs losses/alpha_loss. Tags written only under a flag these runs leave out: none
# (--track mirrors the same tags to wandb).
REAL_RUN_FLAGS = {
    "ppo_continuous": [
        "--env-id",
        "Pendulum-v1",
        "--num-steps",
        "128",
        "--num-minibatches",
        "4",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "256",
    ],
    "ppo_atari": [
        "--env-id",
        GAME,
        "--num-envs",
        "2",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "512",
    ],
    "a2c_atari": ["--env-id", GAME, "--num-envs", "2", "--num-steps", "5", "--log-interval", "2", "--total-timesteps", "500"],
    "sac_continuous": [
        "--env-id",
        "Pendulum-v1",
        "--learning-starts",
        "100",
        "--batch-size",
        "32",
        "--total-timesteps",
        "300",
    ],
    "sac_continuous_ray": [
        "--env-id",
        "Pendulum-v1",
        "--learning-starts",
        "100",
        "--batch-size",
        "32",
        "--worker-batch-steps",
        "50",
        "--num-rollout-workers",
        "1",
        "--total-timesteps",
        "400",
    ],
}
COMMON_FLAGS = ["--keep-best", "--save-model", "--eval-episodes", "1", "--torch-threads", "1"]


def real_run(script: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of the short real run of `script` (REAL_RUN_FLAGS), made once per test session: every test,
    in this file and in test_docs.py, on any xdist worker, that asks for it gets the same run. The first to ask runs
    it under a file lock; the others wait for it and read its result. A failed run fails every test that asks."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above the workers' own
    folder = root / "doc_real_runs" / script
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        result = folder / "result.json"
        if not result.exists():
            shutil.rmtree(folder, ignore_errors=True)
            args = [*REAL_RUN_FLAGS[script], *COMMON_FLAGS, "--runs-dir", folder / "runs"]
            if script == "sac_continuous_ray":  # Ray: a run that fails or times out leaves no Ray process behind
                from tests.test_sac_continuous_ray_e2e import run_ray

                proc = run_ray(*args, timeout=600)
            else:
                proc = run_script(f"{script}.py", *args, timeout=600)
            folder.mkdir(parents=True, exist_ok=True)
            result.write_text(json.dumps({"returncode": proc.returncode, "stderr": proc.stderr[-3000:]}))
    outcome = json.loads(result.read_text())
    assert outcome["returncode"] == 0, f"the real run of {script}.py failed:\n{outcome['stderr']}"
    return only_run_dir(folder / "runs")


def written_tags(run_dir: Path) -> set:
    """Every scalar tag in every event file under a run folder, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = set()
    for events in run_dir.rglob("events.out.tfevents.*"):
        tags |= set(EventAccumulator(str(events), size_guidance={"scalars": 0}).Reload().Tags()["scalars"])
    return tags


def tags_on_page(text: str) -> set:
    return set(TAG.findall(text))


def as_pattern(tag: str) -> re.Pattern:
    """A page's tag as a pattern: a generic tag such as charts/<phase>_us_per_step stands for any phase's tag."""
    return re.compile(
        "".join(r"[A-Za-z0-9_]+" if part.startswith("<") else re.escape(part) for part in re.split(r"(<[^>]*>)", tag) if part)
    )


def unwritten(named: set, written: set) -> list:
    """The tags a page names that no event file of the run holds (a generic one: none of its kind)."""
    return sorted(tag for tag in named if not any(as_pattern(tag).fullmatch(w) for w in written))


def undocumented(written: set, named: set) -> list:
    """The tags the run wrote that the page names nowhere (neither as such nor by a generic tag)."""
    return sorted(w for w in written if not any(as_pattern(tag).fullmatch(w) for tag in named))


def ray_in_the_ray_group(scripts) -> list:
    """sac_continuous_ray starts Ray: its tests carry the `ray` marker, which tests/conftest.py turns into the suite's
    `ray` xdist group (the tests that start Ray, one at a time)."""
    return [pytest.param(s, marks=pytest.mark.ray) if s == "sac_continuous_ray" else s for s in scripts]


@pytest.mark.parametrize("script", ray_in_the_ray_group(SCRIPTS))
def test_every_tag_a_page_names_is_written_by_a_real_run(script, tmp_path_factory):
    named = tags_on_page(page(script))
    assert {"charts/episodic_return", "charts/SPS", "eval/episodic_return"} <= named
    missing = unwritten(named, written_tags(real_run(script, tmp_path_factory)))
    assert not missing, f"docs/{script}.md names tags that a real run of {script}.py does not write: {missing}"


@pytest.mark.parametrize("script", ray_in_the_ray_group(SCRIPTS))
def test_every_tag_a_real_run_writes_is_on_its_page(script, tmp_path_factory):
    """The converse: a tag added to a script must be documented."""
    written = written_tags(real_run(script, tmp_path_factory))
    # the run was long enough for the tags written at an episode's end, at the evaluation and by --keep-best
    assert {"charts/episodic_return", "eval/episodic_return", "eval/best_return", "charts/best_training_return"} <= written
    missing = undocumented(written, tags_on_page(page(script)))
    assert not missing, f"a real run of {script}.py writes tags that docs/{script}.md does not name: {missing}"


def test_the_tag_check_catches_a_wrong_tag(tmp_path_factory):
    written = written_tags(real_run("ppo_atari", tmp_path_factory))
    assert "charts/clip_coef" in written and "losses/clipfrac" in written
    wrong = page("ppo_atari").replace("`charts/clip_coef`", "`charts/clip_range`")
    assert unwritten(tags_on_page(wrong), written) == ["charts/clip_range"]
    assert undocumented(written, tags_on_page(wrong)) == ["charts/clip_coef"]
    # a generic tag stands for the phases the run timed, and only for tags of its form
    assert unwritten({"charts/<phase>_us_per_step", "charts/<phase>_ms_per_step"}, written) == ["charts/<phase>_ms_per_step"]
    assert undocumented({"charts/rollout_us_per_step", "charts/SPS"}, {"charts/<phase>_us_per_step"}) == ["charts/SPS"]
    # other scripts' tags (SAC's, the Ray driver's) are not this run's
    assert unwritten({"charts/weight_staleness", "losses/alpha_loss"}, written) == [
        "charts/weight_staleness",
        "losses/alpha_loss",
    ]


# ---- the speed each page states is the one benchmarks/results/speed_vs_reference.json holds now ----
SPEED_JSON = ROOT / "benchmarks" / "results" / "speed_vs_reference.json"


def speed_paragraph(page: str) -> str:
    """The page's paragraph that starts with **Speed** (empty if none), on one line."""
    paragraphs = re.split(r"\n\s*\n", page)
    return " ".join(next((p for p in paragraphs if p.startswith("**Speed**")), "").split())


def stale_speed_figures(page: str, entry: dict) -> list:
    """The JSON entry's figures (our SPS, the reference's, the ratio, the reps) the page's **Speed** paragraph lacks."""
    paragraph = speed_paragraph(page)
    figures = (
        f"{entry['ours_sps']:,.0f}",
        f"{entry['reference_sps']:,.0f}",
        f"{entry['ratio']:.2f}×",
        f"{entry['reps']} reps",
    )
    return [figure for figure in figures if figure not in paragraph]


@pytest.mark.parametrize("script", ["ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous"])
def test_the_speed_a_page_states_is_the_measured_one(script):
    entry = json.loads(SPEED_JSON.read_text())[f"{script}.py"]
    page = (ROOT / "docs" / f"{script}.md").read_text()
    assert speed_paragraph(page), f"docs/{script}.md has no **Speed** paragraph"
    assert stale_speed_figures(page, entry) == [], f"docs/{script}.md: {speed_paragraph(page)[:200]}"


def test_the_speed_check_catches_a_stale_figure():
    # ppo_atari.md before the check: an older round's figures against the JSON's 599 vs 392, 1.53x, 5 reps
    page = "text\n\n**Speed** (5 reps): 586 steps per\nsecond against 447, **1.31×**.\n\nmore"
    entry = {"ours_sps": 599.0, "reference_sps": 392.0, "ratio": 1.53, "reps": 5}
    assert stale_speed_figures(page, entry) == ["599", "392", "1.53×"]
    assert stale_speed_figures(page.replace("586", "599").replace("447", "392").replace("1.31", "1.53"), entry) == []


# ---- every link and image a page names exists; each script's page shows its result figure ----
def local_links(text: str) -> list:
    """(is an image, target) of every markdown link and image to a file of this repository (no URL, no #anchor)."""
    return [
        (bang == "!", target.split("#", 1)[0])
        for bang, target in re.findall(r"(!?)\[[^\]]*\]\(([^)\s]+)\)", text)
        if "://" not in target and not target.startswith("#")
    ]


@pytest.mark.parametrize("name", sorted(path.name for path in (ROOT / "docs").glob("*.md")))
def test_every_link_and_image_a_page_names_exists(name):
    links = local_links((ROOT / "docs" / name).read_text())
    missing = [target for _, target in links if not (ROOT / "docs" / target).exists()]
    assert not missing, f"docs/{name} links to files that do not exist: {missing}"
    if name[: -len(".md")] in SCRIPTS:  # a script's page shows a result figure of the script
        images = [target for is_image, target in links if is_image]
        assert any(Path(target).name.startswith(name[: -len(".md")] + "_") for target in images), images


def test_the_link_check_catches_a_missing_image():
    text = "![a](../benchmarks/results/x.png) [b](sweeps.md#a-grid) [c](https://example.com/y.md) [d](#flags)"
    assert local_links(text) == [(True, "../benchmarks/results/x.png"), (False, "sweeps.md")]
    assert not (ROOT / "docs" / "../benchmarks/results/x.png").exists()
