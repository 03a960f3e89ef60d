"""Copy FILE's `# --- shared: NAME ---` blocks into the other top-level scripts of its folder that carry them: an edit
made in one copy then reaches all (tests/test_shared_blocks.py requires identical copies). Refuses, writing nothing, when
those other copies already differ from each other: two copies were edited, and only a person knows which is right."""

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = re.compile(r"^# --- shared: (?P<name>[\w-]+) ---$")
END = re.compile(r"^# --- end shared: (?P<name>[\w-]+) ---$")
HINT = "edit one copy and run `python tools/sync_shared.py <that script>`"
USAGE = """examples:
  python tools/sync_shared.py ppo_continuous.py    copy its shared blocks to the other scripts that carry them
  python tools/sync_shared.py --check              list the blocks whose copies differ (exit 1), change nothing"""


class Refused(Exception):
    """Copying would overwrite an edit, or a script's markers are broken: nothing was written."""


def block_spans(text: str) -> dict:
    """{name: (first, stop)}: the block's body is text.splitlines()[first:stop], the lines between its two markers.
    Raises ValueError on unclosed, nested, mismatched or repeated markers."""
    spans, current, first = {}, None, 0
    for number, line in enumerate(text.splitlines(), 1):
        start, end = START.match(line), END.match(line)
        if start:
            if current is not None:
                raise ValueError(f"line {number}: block '{start['name']}' starts inside block '{current}'")
            if start["name"] in spans:
                raise ValueError(f"line {number}: block '{start['name']}' appears twice")
            current, first = start["name"], number  # the body starts on the line after the marker (index `number`)
            spans[current] = None
        elif end:
            if end["name"] != current:
                raise ValueError(f"line {number}: end of '{end['name']}' but the open block is '{current}'")
            spans[current], current = (first, number - 1), None
        elif current is None and ("--- shared" in line or "--- end shared" in line):
            raise ValueError(f"line {number}: malformed marker {line!r}")
    if current is not None:
        raise ValueError(f"block '{current}' is never closed")
    return spans


def extract_blocks(text: str) -> dict:
    """{name: block text}; raises ValueError on unclosed, nested, mismatched or repeated markers."""
    lines = text.splitlines()
    return {name: "\n".join(lines[first:stop]) for name, (first, stop) in block_spans(text).items()}


def scripts_in(folder: Path) -> list:
    """The scripts that share blocks: the top-level *.py files of the folder."""
    return sorted(Path(folder).glob("*.py"))


def read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")  # bytes, not read_text(): line endings are kept as they are


def parse(texts: dict) -> dict:
    """{script: text} -> {script: {block name: block text}}; Refused names a script whose markers are broken."""
    blocks = {}
    for script, text in texts.items():
        try:
            blocks[script] = extract_blocks(text)
        except ValueError as error:
            raise Refused(f"{script}: {error}") from None
    return blocks


def load_blocks(folder: Path) -> dict:
    """{script name: {block name: block text}} for every script of the folder."""
    return parse({path.name: read(path) for path in scripts_in(folder)})


def versions(copies: dict) -> list:
    """{script: block text} -> the scripts grouped by identical text, the largest group first: [[a, b], [c]]."""
    groups = {}
    for script, text in sorted(copies.items()):
        groups.setdefault(text, []).append(script)
    return sorted(groups.values(), key=lambda group: (-len(group), group))


def differing_blocks(blocks: dict) -> dict:
    """{block: versions} for every block whose copies are not all identical; `blocks` as load_blocks gives it."""
    names = sorted({name for script_blocks in blocks.values() for name in script_blocks})
    found = {}
    for name in names:
        groups = versions({script: b[name] for script, b in blocks.items() if name in b})
        if len(groups) > 1:
            found[name] = groups
    return found


def describe(name: str, groups: list) -> str:
    """ "shared block 'x' differs between a.py (same as b.py) and c.py"."""
    named = [group[0] + (f" (same as {', '.join(group[1:])})" if group[1:] else "") for group in groups]
    return f"shared block '{name}' differs between {', '.join(named[:-1])} and {named[-1]}"


def sync(source: Path) -> list:
    """Copy every shared block of `source` into the other scripts of its folder that carry it; returns one line per
    block copied. Raises Refused, having written nothing, if any block's other copies differ from each other."""
    source = Path(source).resolve()
    paths = {path.name: path for path in scripts_in(source.parent)}
    if source.name not in paths:
        raise Refused(f"{source} is not a top-level .py script of its folder")
    texts = {name: read(path) for name, path in paths.items()}
    blocks = parse(texts)
    conflicts, copies = [], {}  # copies: {block: (the scripts that get source's copy, their copy now)}
    for name, body in blocks[source.name].items():
        others = {script: b[name] for script, b in blocks.items() if script != source.name and name in b}
        groups = versions(others)
        if len(groups) > 1:
            conflicts.append(describe(name, groups))
        elif groups and others[groups[0][0]] != body:
            copies[name] = (groups[0], others[groups[0][0]])
    if conflicts:
        raise Refused(
            f"nothing was written: the copies outside {source.name} already disagree (two copies were edited; "
            "make them agree by hand, then rerun)\n" + "\n".join(conflicts)
        )

    source_lines = texts[source.name].splitlines(keepends=True)
    source_spans = block_spans(texts[source.name])
    new_texts, report = {}, []
    for name, (scripts, old) in copies.items():
        first, stop = source_spans[name]
        body = source_lines[first:stop]
        for script in scripts:
            text = new_texts.get(script, texts[script])
            at, end = block_spans(text)[name]
            lines = text.splitlines(keepends=True)
            lines[at:end] = body  # only the lines between the markers change
            new_texts[script] = "".join(lines)
        diff = [line[0] for line in difflib.ndiff(old.splitlines(), blocks[source.name][name].splitlines())]
        added, removed = diff.count("+"), diff.count("-")
        report.append(f"{name}: copied from {source.name} (+{added} -{removed} lines) to {', '.join(scripts)}")
    changed_meanwhile = [script for script in new_texts if read(paths[script]) != texts[script]]
    if changed_meanwhile:
        raise Refused(f"{', '.join(changed_meanwhile)} changed while syncing; nothing was written, rerun")
    for script, text in new_texts.items():
        paths[script].write_bytes(text.encode("utf-8"))
    return report


def check(folder: Path) -> list:
    """One line per block whose copies differ across the folder's scripts (empty: all agree)."""
    return [describe(name, groups) for name, groups in differing_blocks(load_blocks(folder)).items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", nargs="?", type=Path, help="the script whose shared blocks are the right ones")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 listing the blocks that differ")
    parser.add_argument(
        "--root", type=Path, default=None, help="the scripts' folder for --check (default: FILE's folder, else the repository)"
    )
    args = parser.parse_args(argv)
    if args.file is None and not args.check:
        parser.error("name the script you edited (or pass --check)")
    if args.file is not None and args.root is not None and args.file.resolve().parent != args.root.resolve():
        parser.error("FILE must lie in --root (the scripts are the top-level *.py files of FILE's folder)")
    try:
        if args.check:
            folder = args.root or (args.file.resolve().parent if args.file else ROOT)
            differing = check(folder)
            for line in differing:
                print(line)
            print(f"{HINT}" if differing else f"every shared block is identical across {len(scripts_in(folder))} scripts")
            return 1 if differing else 0
        report = sync(args.file)
    except Refused as refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 1
    for line in report:
        print(line)
    if not report:
        print(f"{args.file.name}: every shared block already matches the other copies; nothing changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
