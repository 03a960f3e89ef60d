"""The flags table of each script's doc page, generated from the script's `Args` dataclass.

    python docs/flags_tables.py            # rewrite the table between the markers in every docs/<script>.md
    python docs/flags_tables.py --check    # exit 1 if a page's table is not what its script's Args gives

The script is read with `ast`, never imported (no torch, no gymnasium needed). Each field of `Args` becomes a row:
`--flag-name` (the field name with `-` for `_`, as tyro spells it; a bool flag also has `--no-flag-name`), its
annotation, its default as written in the source, and its help: the inline `# comment` after the field, or the
docstring under it. Fields declared `field(init=False, ...)` are derived at start-up and are not flags: they are
left out. A `# --- section ---` comment in the class body starts a section row (algorithm, run, ...).
"""

import argparse
import ast
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ("ppo_continuous", "ppo_atari", "a2c_atari", "sac_continuous", "sac_continuous_ray")
BEGIN, END = "<!-- flags:begin -->", "<!-- flags:end -->"
SECTION = re.compile(r"^#\s*---\s*(.+?)\s*---\s*$")


def args_class(tree: ast.Module) -> ast.ClassDef:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Args":
            return node
    raise ValueError("no top-level class Args")


def is_derived(node: ast.AnnAssign) -> bool:
    """`name: type = field(init=False, ...)`: a derived field (Args.__post_init__ sets it), not a flag."""
    value = node.value
    return (
        isinstance(value, ast.Call)
        and getattr(value.func, "id", getattr(value.func, "attr", None)) == "field"
        and any(k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords)
    )


def comments_by_line(source: str) -> dict:
    """{line number: comment text without '#'} for every comment token (a '#' inside a string is not one)."""
    comments = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string
    return comments


def source_segment(lines: list, node: ast.AST) -> str:
    """ast.get_source_segment on lines split once (it splits the whole file again at every call: 6 s for the scripts'
    ~400 fields, against 0.5 s here). Offsets are in UTF-8 bytes, as ast gives them."""
    chunk = [line.encode() for line in lines[node.lineno - 1 : node.end_lineno]]
    chunk[-1] = chunk[-1][: node.end_col_offset]  # the end first: on a one-line node both cut the same line
    chunk[0] = chunk[0][node.col_offset :]
    return b"".join(chunk).decode()


def flag_rows(source: str) -> list:
    """[("section", name)] and [("flag", flag, type, default, help)] in the order of the Args class body."""
    tree = ast.parse(source)
    cls = args_class(tree)
    comments = comments_by_line(source)
    lines = io.StringIO(source).readlines()  # split at "\n" only, as ast counts lines
    rows, body = [], cls.body
    last_line = cls.lineno  # the class line (a section comment may follow it at once)
    for i, node in enumerate(body):
        for line in range(last_line + 1, node.lineno):  # section comments between the previous statement and this one
            match = SECTION.match(comments.get(line, ""))
            if match:
                rows.append(("section", match.group(1)))
        last_line = node.end_lineno
        if not isinstance(node, ast.AnnAssign) or not isinstance(node.target, ast.Name):
            continue
        if is_derived(node):
            continue
        name = node.target.id
        annotation = source_segment(lines, node.annotation)
        default = source_segment(lines, node.value) if node.value is not None else ""
        help_text = comments.get(node.end_lineno, "").lstrip("#").strip()
        following = body[i + 1] if i + 1 < len(body) else None
        if not help_text and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            if isinstance(following.value.value, str):
                help_text = " ".join(following.value.value.split())  # a docstring over several lines: one line
        rows.append(("flag", "--" + name.replace("_", "-"), annotation, default, help_text))
    # a section followed by no flag (e.g. "derived from the flags above") is dropped
    return [row for j, row in enumerate(rows) if row[0] == "flag" or (j + 1 < len(rows) and rows[j + 1][0] == "flag")]


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def code(text: str) -> str:
    """Inline code that may itself hold backticks (a default string would)."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def markdown_table(rows: list) -> str:
    lines = ["| flag | type | default | help |", "|---|---|---|---|"]
    for row in rows:
        if row[0] == "section":
            lines.append(f"| **{cell(row[1])}** | | | |")
        else:
            _, flag, annotation, default, help_text = row
            lines.append(f"| {cell(code(flag))} | {cell(code(annotation))} | {cell(code(default))} | {cell(help_text)} |")
    return "\n".join(lines)


def table_for(script: Path) -> str:
    return markdown_table(flag_rows(script.read_text()))


def with_table(page: str, table: str, name: str = "page") -> str:
    """The page with the text between the markers replaced by the table (the markers stay)."""
    if page.count(BEGIN) != 1 or page.count(END) != 1 or page.index(BEGIN) > page.index(END):
        raise ValueError(f"{name}: needs exactly one {BEGIN} ... {END} pair")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    note = "<!-- generated by docs/flags_tables.py from the script's Args; do not edit -->"
    return f"{head}{BEGIN}\n{note}\n{table}\n{END}{tail}"


def stale_pages(root: Path = ROOT, scripts: tuple = SCRIPTS) -> list:
    """The pages whose table is not what their script's Args gives (a missing page or marker counts as stale)."""
    stale = []
    for script in scripts:
        page = root / "docs" / f"{script}.md"
        try:
            text = page.read_text()
            if with_table(text, table_for(root / f"{script}.py"), page.name) != text:
                stale.append(page.name)
        except (OSError, ValueError) as e:
            stale.append(f"{page.name} ({e})")
    return stale


def write_pages(root: Path = ROOT, scripts: tuple = SCRIPTS) -> list:
    changed = []
    for script in scripts:
        page = root / "docs" / f"{script}.md"
        text = page.read_text()
        new = with_table(text, table_for(root / f"{script}.py"), page.name)
        if new != text:
            page.write_text(new)
            changed.append(page.name)
    return changed


def main(argv: list = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page's flags table is out of date")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this file's parent's)")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_pages(args.root)
        for name in stale:
            print(f"out of date: docs/{name}: run python docs/flags_tables.py", file=sys.stderr)
        return 1 if stale else 0
    for name in write_pages(args.root):
        print(f"rewrote the flags table of docs/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
