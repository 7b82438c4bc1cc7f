"""Every example in README.md, docs/ and examples/ runs as written.

Each fenced block of a markdown file is one step, run in order in one fresh directory per file
(a later block may use the store or file an earlier one made):

* ``python``: written to a script and run with the repository's ``.venv`` python;
* ``bash`` / ``sh`` / ``shell``: run with ``bash -euo pipefail``; ``console``: its ``$ `` lines;
  ``.venv/bin`` is first on ``PATH`` and ``.venv`` is linked into the directory, so both
  ``rkv ...`` and ``.venv/bin/rkv ...`` work;
* anything else (``text``, ``toml``, ``json``, ...) is not run. A block without a language is
  an error: say what it is.

An HTML comment on the line before a block (blank lines between are allowed) changes that:

* ``<!-- example: skip (why) -->``: not run (a fragment, a benchmark, needs a GPU, ...);
* ``<!-- example: slow -->``: run only under ``pytest -m slow`` (more than ~20 s);
* ``<!-- example: continue -->``: a python block that continues the previous one (one script);
* ``<!-- example: file NAME -->``: the block is written to ``NAME`` for later blocks to use;
* ``<!-- example: timeout SECONDS -->``: a longer limit than the default.

Several go in one comment, separated by ``;``. Every ``examples/*.py`` runs as a script too
(a ``# example: slow`` line among its first lines makes it slow). Stores the examples leave
behind are destroyed with their memory tiers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = REPO / ".venv"
PYTHON = VENV / "bin" / "python" if (VENV / "bin" / "python").exists() else Path(sys.executable)
MARKDOWN = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
EXAMPLES = sorted((REPO / "examples").glob("*.py"))

PYTHON_LANGS = {"python", "py", "python3"}
SHELL_LANGS = {"bash", "sh", "shell", "console"}
TIMEOUT_S = 60.0
SLOW_TIMEOUT_S = 1800.0

_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_MARK = re.compile(r"^\s*<!--\s*example:\s*(?P<body>.*?)\s*-->\s*$")


class MarkError(ValueError):
    """A malformed ``<!-- example: ... -->`` comment."""


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    skip: str | None = None
    slow: bool = False
    cont: bool = False
    file: str | None = None
    timeout: float | None = None

    @property
    def where(self) -> str:
        return f"{_rel(self.path)}:{self.line}"


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _apply_marks(block: Block, body: str) -> None:
    # ';' separates marks, except inside a skip's parenthesised reason
    for part in (p.strip() for p in re.split(r";(?![^()]*\))", body)):
        word, _, arg = part.partition(" ")
        arg = arg.strip()
        if word == "skip":
            if not re.fullmatch(r"\(.+\)", arg):
                raise MarkError(f"{block.where}: 'skip' needs a reason in parentheses")
            block.skip = arg[1:-1]
        elif word == "slow" and not arg:
            block.slow = True
        elif word == "continue" and not arg:
            block.cont = True
        elif word == "file" and re.fullmatch(r"[\w.-]+(/[\w.-]+)*", arg):
            block.file = arg
        elif word == "timeout" and re.fullmatch(r"\d+", arg):
            block.timeout = float(arg)
        else:
            raise MarkError(f"{block.where}: unknown example mark {part!r}")


def parse(path: Path) -> list[Block]:
    """The fenced code blocks of a markdown file, with their marks."""
    lines = path.read_text(encoding="utf-8").split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(rf"^\s*{re.escape(fence)}\s*$", lines[i]):
            # drop the list indentation the opening fence had (as CommonMark does)
            body.append(re.sub(rf"^ {{0,{indent}}}", "", lines[i]))
            i += 1
        if i == len(lines):
            raise MarkError(f"{_rel(path)}:{start + 1}: unclosed code fence")
        i += 1
        info = m["info"].strip()
        block = Block(path, start + 1, info.split()[0].lower() if info else "",
                      "\n".join(body) + "\n")
        j = start - 1
        while j >= 0 and not lines[j].strip():
            j -= 1
        mark = _MARK.match(lines[j]) if j >= 0 else None
        if mark:
            _apply_marks(block, mark["body"])
        blocks.append(block)
    seen_python = False
    for b in blocks:
        if b.cont and b.lang not in PYTHON_LANGS:
            raise MarkError(f"{b.where}: 'continue' is for python blocks")
        if b.cont and not seen_python:
            raise MarkError(f"{b.where}: 'continue' follows no python block")
        seen_python |= b.lang in PYTHON_LANGS
    return blocks


@dataclass
class Step:
    """One thing to run: a script (python blocks joined by 'continue') or a shell block."""

    blocks: list[Block] = field(default_factory=list)

    @property
    def first(self) -> Block:
        return self.blocks[0]


def steps(blocks: list[Block], slow: bool) -> list[Step | Block]:
    """What to run, in order: ``Step``s to execute and ``Block``s to write as files."""
    out: list[Step | Block] = []
    script: Step | None = None  # the python script a 'continue' block extends, if it runs
    for b in blocks:
        if b.file:
            out.append(b)
            continue
        runs = b.skip is None and (slow or not b.slow)
        if b.cont:  # parse() checked that a python block came before
            if script is not None and runs:
                script.blocks.append(b)
            continue
        if b.lang in PYTHON_LANGS:
            script = Step([b]) if runs else None  # what continues a skipped block is skipped
            if script is not None:
                out.append(script)
        elif b.lang in SHELL_LANGS and runs:
            out.append(Step([b]))
    return out


def _shell_script(b: Block) -> str:
    if b.lang != "console":
        return b.code
    cmds, more = [], False
    for line in b.code.split("\n"):
        if line.startswith("$ ") or more:
            text = line[2:] if line.startswith("$ ") and not more else line
            cmds.append(text)
            more = text.rstrip().endswith("\\")
    return "\n".join(cmds) + "\n"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RKV_")}
    env["PATH"] = f"{VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env.update(MPLBACKEND="Agg", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               PYTHONUNBUFFERED="1", NO_COLOR="1", COLUMNS="120")
    return env


def _run(cmd: list[str], cwd: Path, timeout: float, what: str) -> None:
    # a session of its own: a block that times out is killed with its worker processes
    with subprocess.Popen(cmd, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            pytest.fail(f"{what}: still running after {timeout:.0f} s (mark it slow, or make "
                        f"it faster)\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-2000:]}")
    if proc.returncode != 0:
        pytest.fail(f"{what}: exit status {proc.returncode}\n--- stdout\n{out[-3000:]}"
                    f"\n--- stderr\n{err[-5000:]}")


def _destroy_stores(root: Path) -> None:
    """Destroy every store under ``root`` (their memory tiers live in /dev/shm). A store is a
    directory whose ``index`` holds an LMDB file; links (``.venv``) are not followed."""
    from rkv import Engine

    stores = [Path(d) for d, dirs, _ in os.walk(root, followlinks=False)
              if "index" in dirs and (Path(d) / "index" / "data.mdb").is_file()]
    for store in stores:
        if store.exists():  # not inside a store destroyed before
            Engine.destroy(store)


def _workdir(tmp_path: Path) -> tuple[Path, Path]:
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    if VENV.is_dir():
        (work / ".venv").symlink_to(VENV)
    return work, scripts


def run_markdown(path: Path, tmp_path: Path, slow: bool) -> None:
    work, scripts = _workdir(tmp_path)
    try:
        for item in steps(parse(path), slow):
            if isinstance(item, Block):
                assert item.file is not None
                (work / item.file).parent.mkdir(parents=True, exist_ok=True)
                (work / item.file).write_text(item.code, encoding="utf-8")
                continue
            b = item.first
            timeout = b.timeout or (SLOW_TIMEOUT_S if b.slow else TIMEOUT_S)
            if b.lang in PYTHON_LANGS:
                script = scripts / f"block_{b.line}.py"
                script.write_text("".join(x.code for x in item.blocks), encoding="utf-8")
                cmd = [str(PYTHON), str(script)]
            else:
                script = scripts / f"block_{b.line}.sh"
                script.write_text(_shell_script(b), encoding="utf-8")
                cmd = ["bash", "-euo", "pipefail", str(script)]
            lines = "+".join(str(x.line) for x in item.blocks)
            _run(cmd, work, timeout, f"{_rel(path)}:{lines} ({b.lang})")
    finally:
        _destroy_stores(work)


def _ids(paths: list[Path]) -> list[str]:
    return [_rel(p) for p in paths]


@pytest.mark.parametrize("path", MARKDOWN, ids=_ids(MARKDOWN))
def test_markdown_examples(path: Path, tmp_path: Path) -> None:
    run_markdown(path, tmp_path, slow=False)


def _has_slow(path: Path) -> bool:
    try:
        return any(b.slow for b in parse(path))
    except MarkError:
        return False  # test_markdown_examples reports it


SLOW_MARKDOWN = [p for p in MARKDOWN if _has_slow(p)]


@pytest.mark.slow
@pytest.mark.parametrize("path", SLOW_MARKDOWN, ids=_ids(SLOW_MARKDOWN))
def test_markdown_examples_slow(path: Path, tmp_path: Path) -> None:
    run_markdown(path, tmp_path, slow=True)


@pytest.mark.parametrize("path", MARKDOWN, ids=_ids(MARKDOWN))
def test_every_block_says_what_it_is(path: Path) -> None:
    untagged = [b.where for b in parse(path) if not b.lang]
    assert not untagged, ("code blocks without a language (```python, ```bash, ```text, ...): "
                          + ", ".join(untagged))


def _is_slow_script(p: Path) -> bool:
    head = p.read_text(encoding="utf-8").split("\n")[:15]
    return any(line.strip() == "# example: slow" for line in head)


FAST_SCRIPTS = [p for p in EXAMPLES if not _is_slow_script(p)]
SLOW_SCRIPTS = [p for p in EXAMPLES if _is_slow_script(p)]


def _run_script(path: Path, tmp_path: Path, timeout: float) -> None:
    work, _ = _workdir(tmp_path)
    try:
        _run([str(PYTHON), str(path)], work, timeout, _rel(path))
    finally:
        _destroy_stores(work)


@pytest.mark.parametrize("path", FAST_SCRIPTS, ids=_ids(FAST_SCRIPTS))
def test_example_scripts(path: Path, tmp_path: Path) -> None:
    _run_script(path, tmp_path, TIMEOUT_S)


@pytest.mark.slow
@pytest.mark.parametrize("path", SLOW_SCRIPTS, ids=_ids(SLOW_SCRIPTS))
def test_example_scripts_slow(path: Path, tmp_path: Path) -> None:
    _run_script(path, tmp_path, SLOW_TIMEOUT_S)


# -- the runner itself ---------------------------------------------------------------------


def test_parser_marks_and_steps(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "text\n\n<!-- example: file cfg.toml -->\n```toml\na = 1\n```\n\n"
        "```python\nx = 1\n```\n<!-- example: continue -->\n\n```python\nprint(x)\n```\n"
        "<!-- example: skip (a fragment) -->\n```python\nundefined\n```\n"
        "<!-- example: slow; timeout 99 -->\n```bash\nsleep 1\n```\n"
        "<!-- example: slow -->\n```python\nslow = 1\n```\n<!-- example: continue -->\n"
        "```python\nprint(slow)\n```\n"
        "<!-- example: skip (why; because) -->\n```bash\nfalse\n```\n"
        "- a list\n\n  ```console\n  $ echo hi \\\n    there\n  hi there\n  ```\n"
        "```\nuntagged\n```\n", encoding="utf-8")
    blocks = parse(md)
    assert [b.lang for b in blocks] == ["toml", "python", "python", "python", "bash", "python",
                                        "python", "bash", "console", ""]
    assert blocks[7].skip == "why; because" and blocks[6].cont and not blocks[6].slow
    slow_pair = blocks[5:7]
    del blocks[5:8]
    assert blocks[0].file == "cfg.toml" and blocks[2].cont and blocks[3].skip == "a fragment"
    assert blocks[4].slow and blocks[4].timeout == 99
    assert _shell_script(blocks[5]) == "echo hi \\\n  there\n"
    fast = steps(blocks, slow=False)
    assert fast[0] is blocks[0]
    assert isinstance(fast[1], Step) and fast[1].blocks == blocks[1:3]
    assert isinstance(fast[2], Step) and fast[2].first is blocks[5] and len(fast) == 3
    assert len(steps(blocks, slow=True)) == 4
    assert steps(slow_pair, slow=False) == []
    both = steps(slow_pair, slow=True)
    assert len(both) == 1 and isinstance(both[0], Step) and both[0].blocks == slow_pair
    bad = tmp_path / "bad.md"
    for text, msg in (("<!-- example: skip -->\n```python\n```\n", "reason"),
                      ("<!-- example: fast -->\n```python\n```\n", "unknown"),
                      ("```python\nx\n", "unclosed"),
                      ("<!-- example: continue -->\n```bash\n```\n", "python blocks"),
                      ("<!-- example: continue -->\n```python\n```\n", "no python block")):
        bad.write_text(text, encoding="utf-8")
        with pytest.raises(MarkError, match=msg):
            parse(bad)


def test_runner_runs_in_order_and_reports_a_failing_block(tmp_path: Path) -> None:
    md = tmp_path / "doc.md"
    md.write_text("<!-- example: file a.txt -->\n```text\nhello\n```\n"
                  "```bash\ntest \"$(cat a.txt)\" = hello && rkv --help > help.txt\n```\n"
                  "```python\nimport pathlib\nassert pathlib.Path('help.txt').stat().st_size\n"
                  "raise SystemExit('boom')\n```\n", encoding="utf-8")
    (tmp_path / "run").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"doc.md:8 \(python\)[^$]*boom"):
        run_markdown(md, tmp_path / "run", slow=False)


def test_runner_times_out_and_destroys_stores(tmp_path: Path) -> None:
    from rkv.store.paths import store_id_at

    md = tmp_path / "doc.md"
    md.write_text("```python\nfrom rkv import Engine\nEngine.open('s').close()\n"
                  "import pathlib; pathlib.Path('index').mkdir()\n```\n"
                  "<!-- example: timeout 2 -->\n```bash\nsleep 30 & wait\n```\n",
                  encoding="utf-8")
    (tmp_path / "run").mkdir()
    with pytest.raises(pytest.fail.Exception, match=r"doc.md:7 \(bash\): still running"):
        run_markdown(md, tmp_path / "run", slow=False)
    work = tmp_path / "run" / "work"
    assert not (work / "s").exists() and (work / "index").is_dir()  # only the store went
    assert store_id_at(work / "s") is None
