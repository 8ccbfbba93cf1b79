"""Every runnable block in README.md and docs/ is a file under docs_src/ that a test runs (issue 51).

The checker holds four rules (docs/testing.md, "Docs examples"):

1. a runnable block (its info string's first word is in ``RUNNABLE``) is a file: in docs/*.md its body
   is one snippet line, ``--8<-- "docs_src/<page>/<file>"`` (or ``...:section``); in README.md, which
   GitHub renders without snippets, the line just before its fence is ``<!-- docs_src/readme/<file> -->``;
   the file (and the section) exists;
2. a README block that names a file shows exactly that file (or section), as mkdocs would include it;
3. every file under docs_src/ is used by a page;
4. every file under docs_src/ is named, as the string ``docs_src/<page>/<file>``, by a test module
   (the test that runs it): ``tests/docs/test_<page>.py``, or, for what needs vLLM or LiteLLM, the
   test under tests/vllm or tests/litellm that reads it; this module aside.

A snippet of a file outside docs_src/ (the example manifests under examples/) passes rule 1 when the
file exists and a test module under tests/ names it, the test that checks it.

Each problem is one line: the page and line (or the file), what is wrong, and the fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.utils import ROOT

RUNNABLE = frozenset(
    "python py bash sh shell console yaml yml nginx haproxy ini hcl dockerfile toml".split()
)  # fmt: skip
DOCS_SRC = "docs_src"
# A fence opens with three or more backticks or tildes, indented as deep as the list it sits in.
OPENING = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
# pymdownx.snippets' block form on one line: --8<-- "path" (or 'path'), the path optionally ":section".
SNIPPET = re.compile(r"""^[ \t]*-+8<-+[ \t]+(?P<q>["'])(?P<target>[^"']+)(?P=q)[ \t]*$""")
# README's form: the line before the fence names the file.
README_FILE = re.compile(r"^[ \t]*<!--[ \t]*(?P<target>docs_src/\S+?)[ \t]*-->[ \t]*$")
# A section marker as pymdownx.snippets reads it, in any comment syntax: # --8<-- [start:name]
SECTION_MARK = re.compile(r"-+8<-+[ \t]+\[[ \t]*(?P<kind>start|end)[ \t]*:[ \t]*(?P<name>[a-z][-_0-9a-z]*)[ \t]*\]")
SECTION_NAME = re.compile(r"[a-z][-_0-9a-z]*")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: where it opens, its language, its body, and the line before it."""

    page: str  # relative to the root, e.g. "docs/cli.md"
    line: int  # the opening fence's line, from 1
    lang: str  # the info string's first word, lower case ("" for none)
    body: tuple[str, ...]  # unindented by the fence's own indentation
    before: str  # the line just before the opening fence ("" at the top)

    @property
    def runnable(self) -> bool:
        return self.lang in RUNNABLE


def pages(root: Path) -> list[Path]:
    """README.md and every page of the docs site."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


def blocks(root: Path, page: Path) -> list[Block]:
    """The fenced blocks of a page, nested in lists or not (an indented fence, an indented body)."""
    lines = page.read_text().splitlines()
    name = page.relative_to(root).as_posix()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = OPENING.match(lines[index])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"].expandtabs(4))
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = index + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        body = tuple(unindent(line, indent) for line in lines[index + 1 : end])
        words = opening["info"].strip().lstrip("{.").split()
        lang = words[0].lower().rstrip("}") if words else ""
        found.append(Block(name, index + 1, lang, body, lines[index - 1] if index else ""))
        index = end + 1
    return found


def unindent(line: str, indent: int) -> str:
    """The line less up to ``indent`` columns of leading spaces (a block's place in a list)."""
    expanded = line.expandtabs(4)
    stripped = expanded.lstrip(" ")
    return expanded[min(indent, len(expanded) - len(stripped)) :]


def split_target(target: str) -> tuple[str, str | None]:
    """``"docs_src/x/y.py:name"`` -> ``("docs_src/x/y.py", "name")``; no section -> ``(path, None)``."""
    path, _, section = target.rpartition(":")
    if path and SECTION_NAME.fullmatch(section):
        return path, section
    return target, None


def shown(root: Path, target: str) -> list[str] | None:
    """The lines mkdocs shows for a snippet target: the file less its section markers, or the section.
    None when the file or the section does not exist."""
    path, section = split_target(target)
    file = root / path
    if not file.is_file():
        return None
    lines = file.read_text().splitlines()
    if section is None:
        return [line for line in lines if not SECTION_MARK.search(line)]
    selected: list[str] = []
    inside = found = False
    for line in lines:
        mark = SECTION_MARK.search(line)
        if mark is not None and mark["name"] == section:
            if mark["kind"] == "start":
                inside = found = True
                continue
            if inside:
                break
        elif mark is not None:
            continue  # another section's marker, inside or outside this one
        elif inside:
            selected.append(line)
    return selected if found else None


def suggested(page: str, lang: str) -> str:
    """Where a block of ``page`` goes: docs_src/<page>/<name>.<ext>."""
    folder = "readme" if page == "README.md" else Path(page).stem
    ext = {"python": "py", "bash": "sh", "shell": "sh", "yml": "yaml", "hcl": "nomad.hcl"}.get(lang, lang)
    return f"{DOCS_SRC}/{folder}/<name>.{ext}"


def naming_text(root: Path, within: str) -> str:
    """The text of the test modules under ``within``, this one aside."""
    folder = root / within
    modules = sorted(folder.rglob("test_*.py")) if folder.is_dir() else []
    return "\n".join(module.read_text() for module in modules if module.name != Path(__file__).name)


def block_problems(root: Path, page: Path) -> list[str]:
    """Rules 1 and 2 for one page."""
    problems: list[str] = []
    readme = page.name == "README.md" and page.parent == root
    any_test = None
    for block in blocks(root, page):
        where = f"{block.page}:{block.line}"
        named = README_FILE.match(block.before) if readme else None
        body = [line for line in block.body if line.strip()]
        snippet = SNIPPET.match(body[0]) if len(body) == 1 else None
        if readme and named is None and block.runnable:
            problems.append(
                f"{where}: a ```{block.lang} block that is no file; save its body as "
                f"{suggested(block.page, block.lang)} and put <!-- {suggested(block.page, block.lang)} --> "
                "on the line just before the fence (a test in tests/docs/ runs the file)"
            )
            continue
        if not readme and snippet is None and block.runnable:
            problems.append(
                f"{where}: a ```{block.lang} block written inline; save its body as "
                f"{suggested(block.page, block.lang)} and make the block's body the one line "
                f'--8<-- "{suggested(block.page, block.lang)}" (a test in tests/docs/ runs the file)'
            )
            continue
        target = named["target"] if named else snippet["target"] if snippet else None
        if target is None:
            continue  # a block that is not runnable and includes nothing: text, json, a diagram
        lines = shown(root, target)
        path, section = split_target(target)
        if lines is None:
            if not (root / path).is_file():
                problems.append(f"{where}: the block names {path}, which does not exist; create it or fix the path")
            else:
                problems.append(
                    f"{where}: {path} has no section {section!r}; mark it in the file with "
                    f"--8<-- [start:{section}] and --8<-- [end:{section}] comment lines, or fix the name"
                )
            continue
        if block.runnable and not path.startswith(f"{DOCS_SRC}/"):
            any_test = naming_text(root, "tests") if any_test is None else any_test
            if path not in any_test:
                problems.append(
                    f"{where}: the block includes {path}, which no test under tests/ names; move the "
                    f"example to {suggested(block.page, block.lang)}, or name {path!r} in the test that checks it"
                )
        if named is not None and list(block.body) != lines:
            problems.append(f"{where}: the block differs from {target}: {difference(list(block.body), lines)}")
    return problems


def difference(block: list[str], file: list[str]) -> str:
    """The first line where a README block and its file part, and the fix."""
    for number, (ours, theirs) in enumerate(zip(block, file, strict=False), start=1):
        if ours != theirs:
            return (
                f"its line {number} is {ours!r} where the file has {theirs!r}; "
                "copy the file into the block (the file is what the test runs)"
            )
    longer, shorter = ("block", "file") if len(block) > len(file) else ("file", "block")
    return (
        f"the {longer} has {abs(len(block) - len(file))} more line(s) than the {shorter}; "
        "copy the file into the block (the file is what the test runs)"
    )


def used_targets(root: Path) -> set[str]:
    """Every path a page uses: snippet lines anywhere in docs/ and README's file comments."""
    used: set[str] = set()
    for page in pages(root):
        for line in page.read_text().splitlines():
            found = SNIPPET.match(line) or README_FILE.match(line)
            if found is not None:
                used.add(split_target(found["target"])[0])
    return used


def docs_src_files(root: Path) -> list[str]:
    folder = root / DOCS_SRC
    if not folder.is_dir():
        return []
    return sorted(
        path.relative_to(root).as_posix()
        for path in folder.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def orphan_problems(root: Path) -> list[str]:
    """Rule 3."""
    used = used_targets(root)
    return [
        f"{path}: no page uses it; include it in its page (in docs/: a block whose body is "
        f'--8<-- "{path}"; in README.md: <!-- {path} --> before the block) or delete it'
        for path in docs_src_files(root)
        if path not in used
    ]


def untested_problems(root: Path) -> list[str]:
    """Rule 4."""
    named = naming_text(root, "tests")
    return [
        f"{path}: no test names it; run it from tests/docs/test_{module_for(path)}.py, with the path "
        f"{path!r} written there"
        for path in docs_src_files(root)
        if path not in named
    ]


def module_for(path: str) -> str:
    return Path(path).parts[1].replace("-", "_")


def report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n" + "\n".join(problems)


PAGES = [page.relative_to(ROOT).as_posix() for page in pages(Path(ROOT))]


@pytest.mark.parametrize("page", PAGES)
def test_every_runnable_block_is_a_file_the_page_shows(page: str) -> None:
    problems = block_problems(Path(ROOT), Path(ROOT) / page)
    assert problems == [], report(problems)


def test_every_docs_src_file_is_used_by_a_page() -> None:
    problems = orphan_problems(Path(ROOT))
    assert problems == [], report(problems)


def test_every_docs_src_file_is_run_by_a_test() -> None:
    problems = untested_problems(Path(ROOT))
    assert problems == [], report(problems)


# The checker, able to fail: a small tree with one case of each rule, and the lines it must print.
SYNTHETIC = {
    "README.md": """# demo

```bash
pip install demo
```

<!-- docs_src/readme/app.py -->
```python
print("hello")
```

<!-- docs_src/readme/app.py:greet -->
```python
print("hi")
```

<!-- docs_src/readme/gone.py -->
```python
pass
```

```text
output is not runnable
```
""",
    "docs/page.md": """# A page

1. In a list:

    ```python
    import demo
    ```

2. Included:

    ```yaml
    --8<-- "docs_src/page/ok.yaml"
    ```

```console
--8<-- "docs_src/page/ok.yaml:missing"
```

````markdown
```python
inside a longer fence: shown, not run
```
````

```json
{"wire": "example"}
```

```sh
--8<-- "examples/untested.sh"
```
""",
    "docs_src/readme/app.py": """print("hello, world")
# --8<-- [start:greet]
print("hi")
# --8<-- [end:greet]
""",
    "docs_src/page/ok.yaml": "a: 1\n",
    "docs_src/page/orphan.sh": "echo nobody includes me\n",
    "examples/untested.sh": "echo checked by nothing\n",
    "tests/docs/test_page.py": '"""Runs docs_src/page/ok.yaml and docs_src/page/orphan.sh."""\n',
}


def test_the_checker_names_the_page_the_line_and_the_fix(tmp_path: Path) -> None:
    """1. a bare runnable block in README and one indented in a docs list, a missing file, a missing
    section, an outside file no test names 2. a README block that drifted from its file, a section
    that did not 3. an orphan docs_src file 4. a docs_src file no test names; text, json and a block
    inside a longer fence pass."""
    for name, text in SYNTHETIC.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)

    assert block_problems(tmp_path, tmp_path / "README.md") == [
        "README.md:3: a ```bash block that is no file; save its body as docs_src/readme/<name>.sh and put "
        "<!-- docs_src/readme/<name>.sh --> on the line just before the fence (a test in tests/docs/ runs the file)",
        "README.md:8: the block differs from docs_src/readme/app.py: its line 1 is 'print(\"hello\")' where the "
        "file has 'print(\"hello, world\")'; copy the file into the block (the file is what the test runs)",
        "README.md:18: the block names docs_src/readme/gone.py, which does not exist; create it or fix the path",
    ]
    assert block_problems(tmp_path, tmp_path / "docs/page.md") == [
        "docs/page.md:5: a ```python block written inline; save its body as docs_src/page/<name>.py and make the "
        'block\'s body the one line --8<-- "docs_src/page/<name>.py" (a test in tests/docs/ runs the file)',
        "docs/page.md:15: docs_src/page/ok.yaml has no section 'missing'; mark it in the file with "
        "--8<-- [start:missing] and --8<-- [end:missing] comment lines, or fix the name",
        "docs/page.md:29: the block includes examples/untested.sh, which no test under tests/ names; move the "
        "example to docs_src/page/<name>.sh, or name 'examples/untested.sh' in the test that checks it",
    ]
    assert orphan_problems(tmp_path) == [
        'docs_src/page/orphan.sh: no page uses it; include it in its page (in docs/: a block whose body is --8<-- "'
        'docs_src/page/orphan.sh"; in README.md: <!-- docs_src/page/orphan.sh --> before the block) or delete it'
    ]
    assert untested_problems(tmp_path) == [
        "docs_src/readme/app.py: no test names it; run it from tests/docs/test_readme.py, with the path "
        "'docs_src/readme/app.py' written there"
    ]

    # Each one fixed, the checker is quiet: the drifted block copied from its file, the bare blocks
    # moved to files, the orphan included, every file named by a test.
    (tmp_path / "README.md").write_text(
        "<!-- docs_src/readme/app.py -->\n```python\n"
        + (tmp_path / "docs_src/readme/app.py")
        .read_text()
        .replace("# --8<-- [start:greet]\n", "")
        .replace("# --8<-- [end:greet]\n", "")
        + '```\n\n<!-- docs_src/readme/app.py:greet -->\n```python\nprint("hi")\n```\n'
    )
    (tmp_path / "docs/page.md").write_text(
        '- item\n\n    ```yaml\n    --8<-- "docs_src/page/ok.yaml"\n    ```\n\n'
        '```sh\n--8<-- "docs_src/page/orphan.sh"\n```\n'
    )
    (tmp_path / "tests/docs/test_readme.py").write_text('APP = "docs_src/readme/app.py"\n')
    assert [block_problems(tmp_path, page) for page in pages(tmp_path)] == [[], []]
    assert orphan_problems(tmp_path) == untested_problems(tmp_path) == []


def test_a_fence_in_a_list_keeps_its_body_unindented(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs/p.md").write_text('- a\n\n    ~~~~ yaml title="x"\n    k: v\n      nested: 1\n    ~~~~\n')
    assert blocks(tmp_path, tmp_path / "docs/p.md") == [Block("docs/p.md", 3, "yaml", ("k: v", "  nested: 1"), "")]
