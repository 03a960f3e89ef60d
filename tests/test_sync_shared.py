"""tools/sync_shared.py on copies of the scripts in a tmp folder: an edited block reaches every script that carries it
and nothing else changes; when the other copies already disagree it refuses and writes nothing; --check lists the
blocks that differ."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tools.sync_shared import differing_blocks, load_blocks, scripts_in, sync

TOOL = ROOT / "tools" / "sync_shared.py"
SOURCE = "ppo_continuous.py"


def run_tool(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def scripts(tmp_path):
    """A copy of the top-level scripts, alone in a tmp folder."""
    for script in scripts_in(ROOT):
        shutil.copy(script, tmp_path / script.name)
    return tmp_path


def agreeing_blocks(folder) -> tuple:
    """Two blocks of SOURCE whose copies agree in every script: one all scripts carry, one only some of them carry (a
    block elsewhere may be mid-edit in the repository)."""
    blocks = load_blocks(folder)
    differing = differing_blocks(blocks)
    carriers = {name: {s for s, b in blocks.items() if name in b} for name in blocks[SOURCE] if name not in differing}
    everywhere = next(name for name, c in carriers.items() if c == set(blocks))
    some = next(name for name, c in carriers.items() if 2 < len(c) < len(blocks))  # SOURCE and at least two others
    return everywhere, some, carriers


def edit_block(path, name: str, new_line: str) -> None:
    """Add a line at the top of the block's body."""
    text = path.read_bytes().decode()
    marker = f"# --- shared: {name} ---\n"
    assert text.count(marker) == 1
    path.write_bytes(text.replace(marker, marker + new_line + "\n").encode())


def outside(text: bytes, names) -> bytes:
    """A script's bytes with the bodies of the named blocks cut out (their marker lines stay)."""
    for name in names:
        before, rest = text.split(f"# --- shared: {name} ---\n".encode())
        _, after = rest.split(f"# --- end shared: {name} ---\n".encode())
        text = before + b"<cut>" + after
    return text


def body(path, name: str) -> str:
    return load_blocks(path.parent)[path.name][name]


def snapshot(folder) -> dict:
    return {path.name: path.read_bytes() for path in scripts_in(folder)}


def test_an_edit_reaches_every_script_that_carries_the_block_and_nothing_else(scripts):
    everywhere, some, carriers = agreeing_blocks(scripts)
    before = snapshot(scripts)
    edit_block(scripts / SOURCE, everywhere, "EDITED_EVERYWHERE = 1")
    edit_block(scripts / SOURCE, some, "EDITED_SOME = 2")
    proc = run_tool(scripts / SOURCE)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    for name in (everywhere, some):
        (line,) = [line for line in proc.stdout.splitlines() if line.startswith(f"{name}: ")]
        assert sorted(line.split(" to ")[1].split(", ")) == sorted(carriers[name] - {SOURCE}), line
        assert "(+1 -0 lines)" in line
    for path in scripts_in(scripts):
        for name in (everywhere, some):
            if path.name in carriers[name]:
                assert body(path, name) == body(scripts / SOURCE, name), f"{path.name}: '{name}' was not copied"
        carried = [name for name in (everywhere, some) if path.name in carriers[name]]
        assert outside(path.read_bytes(), carried) == outside(before[path.name], carried), f"{path.name} changed elsewhere"
    assert not differing_blocks(load_blocks(scripts)).keys() & {everywhere, some}

    again = run_tool(scripts / SOURCE)  # in sync now: a second run changes nothing
    assert again.returncode == 0 and "nothing changed" in again.stdout, again.stdout + again.stderr


def test_refuses_and_writes_nothing_when_two_other_copies_differ(scripts):
    everywhere, some, carriers = agreeing_blocks(scripts)
    # SOURCE's edit of `some` would be fine to copy, and it comes first in SOURCE: a tool writing block by block would
    # write it before meeting `everywhere`, which two other scripts have each edited too.
    order = list(load_blocks(scripts)[SOURCE])
    assert order.index(some) < order.index(everywhere)
    edit_block(scripts / SOURCE, some, "FINE = 1")
    edit_block(scripts / SOURCE, everywhere, "MINE = 1")
    first, second = sorted(carriers[everywhere] - {SOURCE})[:2]
    edit_block(scripts / first, everywhere, "THEIRS = 1")
    edit_block(scripts / second, everywhere, "OTHERS = 2")
    before = snapshot(scripts)
    proc = run_tool(scripts / SOURCE)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    print(proc.stderr)
    assert proc.stderr.startswith("error: nothing was written")
    (line,) = [line for line in proc.stderr.splitlines() if f"'{everywhere}'" in line]
    assert first in line and second in line, line
    assert f"'{some}'" not in proc.stderr  # only the block whose copies disagree is named
    assert snapshot(scripts) == before, "a refused sync wrote a file"


def test_check_lists_the_blocks_that_differ_and_changes_nothing(scripts):
    everywhere, some, carriers = agreeing_blocks(scripts)
    other = sorted(carriers[some] - {SOURCE})[0]
    edit_block(scripts / other, some, "DRIFT = 1")
    before = snapshot(scripts)
    proc = run_tool("--check", "--root", scripts)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if f"'{some}'" in line]
    assert line.endswith(f" and {other}"), line  # the drifted copy, alone in its version
    assert "python tools/sync_shared.py" in proc.stdout
    assert f"'{everywhere}'" not in proc.stdout
    assert snapshot(scripts) == before


def test_check_passes_on_agreeing_scripts_and_sync_copies_in_process(tmp_path):
    """A small folder of made-up scripts: --check exits 0 when all copies agree; sync() copies one edit."""
    block = "# --- shared: a ---\nx = 1\n# --- end shared: a ---\n"
    for name in ("one.py", "two.py", "three.py"):
        (tmp_path / name).write_text(f"# {name}\n{block}print('{name}')\n")
    (tmp_path / "none.py").write_text("print('no blocks')\n")
    assert run_tool("--check", "--root", tmp_path).returncode == 0
    (tmp_path / "two.py").write_text((tmp_path / "two.py").read_text().replace("x = 1", "x = 2\ny = 3"))
    assert sync(tmp_path / "two.py") == ["a: copied from two.py (+2 -1 lines) to one.py, three.py"]
    expected = "# one.py\n# --- shared: a ---\nx = 2\ny = 3\n# --- end shared: a ---\nprint('one.py')\n"
    assert (tmp_path / "one.py").read_text() == expected
    assert (tmp_path / "none.py").read_text() == "print('no blocks')\n"


def test_broken_markers_are_refused_naming_the_script(tmp_path):
    (tmp_path / "one.py").write_text("# --- shared: a ---\nx = 1\n# --- end shared: a ---\n")
    (tmp_path / "two.py").write_text("# --- shared: a ---\nx = 2\n")  # never closed
    proc = run_tool(tmp_path / "one.py")
    assert proc.returncode == 1 and "two.py" in proc.stderr and "never closed" in proc.stderr, proc.stderr
    assert (tmp_path / "two.py").read_text() == "# --- shared: a ---\nx = 2\n"
