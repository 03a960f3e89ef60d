"""The doc pages in docs/ hold what the scripts hold: every function or class an "Implementation details" list
names exists in that script, every flags table is the one the script's Args gives, and every TensorBoard tag a
page names is one the script writes. Each check is also shown to fail on a wrong page (the *_catches_* tests)."""

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
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
    return [span for span in re.findall(r"`([^`\n]+)`", section(text, "Implementation details"))
            if (CALL.fullmatch(span) or CLASS.fullmatch(span)) and span not in NOT_NAMES]  # fmt: skip


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
    proc = subprocess.run([sys.executable, str(ROOT / "docs" / "flags_tables.py"), "--check"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_flags_table_lists_every_flag_and_no_derived_field(script):
    table = page(script).split("<!-- flags:begin -->", 1)[1].split("<!-- flags:end -->", 1)[0]
    flags = set(re.findall(r"^\| `(--[a-z0-9-]+)` \|", table, re.M))
    cls = next(n for n in ast.parse(source(script)).body if isinstance(n, ast.ClassDef) and n.name == "Args")
    fields = {n.target.id: ast.unparse(n.annotation) for n in cls.body if isinstance(n, ast.AnnAssign)}
    expected = {"--" + name.replace("_", "-") for name, annotation in fields.items() if "Suppress" not in annotation}
    assert flags == expected
    assert any("Suppress" in a for a in fields.values()), "each script derives some fields; they must stay out"


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
    batch_size: tyro.conf.Suppress[int] = 0  # not a flag
'''
    rows = generator.flag_rows(text)
    assert rows == [("section", "algorithm"), ("flag", "--lr", "float", "3e-4", "the learning rate | with a pipe"),
                    ("flag", "--steps", "int", "1_000", 'how many "# not a comment" steps'),
                    ("flag", "--name", "Optional[str]", "None", "a docstring over two lines")]  # fmt: skip
    assert "the learning rate \\| with a pipe" in generator.markdown_table(rows)


# ---- (3) every TensorBoard tag a page names is one the script writes ----
TAG = re.compile(r"(?<![/\w])((?:charts|losses|eval)/[A-Za-z0-9_<>]+)")  # not the eval/ in runs/<run>/eval/


def tag_sources(script_source: str) -> tuple[set, list]:
    """(every string constant of the script, every f-string as (prefix, suffix) around one placeholder)."""
    constants, templates = set(), []
    for node in ast.walk(ast.parse(script_source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            constants.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            holes = [i for i, p in enumerate(parts) if isinstance(p, ast.FormattedValue)]
            if len(holes) == 1:
                text = lambda ps: "".join(p.value for p in ps if isinstance(p, ast.Constant))  # noqa: E731
                templates.append((text(parts[: holes[0]]), text(parts[holes[0] + 1 :])))
    return constants, templates


def written_by(tag: str, script_source: str) -> bool:
    """Is `tag` written by the script? Either it is a string literal there, or an f-string "prefix{x}suffix" builds it
    and the part that fills {x} is itself a string literal of the script (a phase of run.timer("rollout"), a name of
    LOSS_NAMES). A generic tag such as charts/<phase>_us_per_step must match an f-string's text."""
    constants, templates = tag_sources(script_source)
    if "<" in tag:
        generic = re.sub(r"<[^>]*>", "{}", tag)
        return any(f"{prefix}{{}}{suffix}" == generic for prefix, suffix in templates)
    if tag in constants:
        return True
    for prefix, suffix in templates:
        if tag.startswith(prefix) and tag.endswith(suffix) and len(tag) > len(prefix) + len(suffix):
            if tag[len(prefix) : len(tag) - len(suffix)] in constants:
                return True
    return False


def tags_on_page(text: str) -> set:
    return set(TAG.findall(text))


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_tag_a_page_names_is_written_by_its_script(script):
    tags = tags_on_page(page(script))
    assert {"charts/episodic_return", "charts/SPS", "eval/episodic_return"} <= tags
    unknown = sorted(tag for tag in tags if not written_by(tag, source(script)))
    assert not unknown, f"docs/{script}.md names tags {script}.py never writes: {unknown}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_tag_the_script_writes_is_on_its_page(script):
    """The converse, for the literal tags: a tag added to a script must be documented."""
    constants, _ = tag_sources(source(script))
    literal = {c for c in constants if TAG.fullmatch(c)}
    assert literal, script
    assert literal <= tags_on_page(page(script)), sorted(literal - tags_on_page(page(script)))


def test_the_tag_check_catches_a_wrong_tag():
    ray = source("sac_continuous_ray")
    assert written_by("losses/qf1_values", ray)  # built as f"losses/{name}" over LOSS_NAMES
    assert written_by("charts/update_us_per_step", ray)  # f"charts/{phase}_us_per_step" with run.timer("update")
    assert not written_by("charts/rollout_us_per_step", ray)  # the Ray driver times no rollout phase
    assert not written_by("losses/qf3_values", ray)
    assert not written_by("charts/episode_return", source("ppo_continuous"))
    assert written_by("charts/<phase>_us_per_step", ray) and not written_by("charts/<phase>_ms_per_step", ray)
    wrong = page("ppo_atari").replace("`charts/clip_coef`", "`charts/clip_range`")
    assert sorted(t for t in tags_on_page(wrong) if not written_by(t, source("ppo_atari"))) == ["charts/clip_range"]
