"""The documentation cannot rot silently: README.md and docs/*.md link only to files and headings that exist, and
every ``encoderlab ...`` command they show uses only subcommands and options its parser has.

The parsers are built in a subprocess through the console script's torch-free entry (``encoderlab_cli``), the way
``encoderlab ... --help`` builds them: no command runs, and this test imports neither torch nor the package."""

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Prints {"experiment mlm": ["--attention", ...], ...}: the option strings of every runnable subcommand, built with
# the package's own parser code while the package __init__ (torch, transformers) stays unexecuted.
OPTIONS_SCRIPT = """
import json, sys
from encoderlab_cli import enter_package_without_init
enter_package_without_init()
from encoderlab import cli

def leaves(tree, prefix=()):
    for name, entry in tree.items():
        yield from leaves(entry, prefix + (name,)) if isinstance(entry, dict) else [prefix + (name,)]

def leaf_parser(path):
    parser = cli.build_parser(list(path))
    for name in path:
        parser = next(a for a in parser._actions if a.choices and isinstance(a.choices, dict)).choices[name]
    return parser

options = {" ".join(path): sorted(leaf_parser(path)._option_string_actions) for path in leaves(cli.SUBCOMMANDS)}
assert "torch" not in sys.modules, "building the parsers imported torch"
print(json.dumps(options))
"""

FENCE = re.compile(r"^```(\w*)")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")  # [text](target) and ![image](target)
INLINE_CODE = re.compile(r"`([^`]+)`")
# `encoderlab` as a command word: at the start, after whitespace or `$(`, and as `-m encoderlab.cli`.
COMMAND = re.compile(r"(?:^|(?<=\s)|(?<=\$\())encoderlab(?:\.cli)?\s+")
SHELL_LANGUAGES = {"", "bash", "sh", "shell", "console"}


@pytest.fixture(scope="module")
def command_options() -> dict[str, set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", OPTIONS_SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return {command: set(flags) for command, flags in json.loads(result.stdout).items()}


def prose_and_code(text: str) -> tuple[list[str], list[str]]:
    """(lines outside code blocks, lines inside shell code blocks with backslash continuations joined)."""
    prose, code, language = [], [], None
    for line in text.splitlines():
        fence = FENCE.match(line.strip())
        if fence:
            language = fence.group(1) if language is None else None
            continue
        if language is None:
            prose.append(line)
        elif language in SHELL_LANGUAGES:
            if code and code[-1].endswith("\\"):
                code[-1] = code[-1][:-1] + " " + line.strip()
            else:
                code.append(line)
    return prose, code


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = prose_and_code(path.read_text())
    seen, found = {}, set()
    for line in prose:
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            anchor = github_anchor(heading.group(1))
            count = seen.get(anchor, 0)
            found.add(anchor if count == 0 else f"{anchor}-{count}")
            seen[anchor] = count + 1
    return found


def broken_links(path: Path) -> list[str]:
    prose, _ = prose_and_code(path.read_text())
    problems = []
    for match in LINK.finditer(INLINE_CODE.sub("", " ".join(prose))):  # a link or a code span may wrap lines
        target = match.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            problems.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: no heading with anchor #{anchor} in {linked.name}")
    return problems


def shown_commands(text: str) -> list[str]:
    """The `encoderlab ...` command lines of the shell code blocks, and inline code spans that are commands."""
    prose, code = prose_and_code(text)
    lines = [re.sub(r"(^|\s)#.*$", "", line) for line in code]  # shell comments
    lines += [span for span in INLINE_CODE.findall(" ".join(prose)) if span.startswith("encoderlab ")]
    commands = []
    for line in lines:
        for match in COMMAND.finditer(line):
            rest = line[match.end() :]
            if line[: match.start()].endswith("$("):
                rest = rest.partition(")")[0]
            commands.append(re.split(r"\s(?:\||;|&&)\s", rest)[0].strip())
    return commands


def command_problems(command: str, command_options: dict[str, set[str]]) -> list[str]:
    """Unknown subcommands and options of one command line (the words after `encoderlab`). A placeholder in
    the subcommand's place (`COMMAND`, `...`) ends the check: there is nothing to check it against."""
    words = [word.strip("[]") for word in shlex.split(command)]
    path = []
    while words and not words[0].startswith("-"):
        candidate = " ".join(path + [words[0]])
        if not any(known == candidate or known.startswith(candidate + " ") for known in command_options):
            break
        path.append(words.pop(0))
    name = " ".join(path)
    if name not in command_options:
        if not words and any(known.startswith(name + " ") for known in command_options):
            return []  # a group named on its own (`encoderlab predict`)
        if words and (words[0].isupper() or words[0] == "..."):
            return []
        return [f"`encoderlab {command}`: no subcommand `encoderlab {' '.join(path + words[:1])}`"]
    flags = [word.partition("=")[0] for word in words if re.match(r"^--?[A-Za-z]", word)]
    return [
        f"`encoderlab {command}`: `encoderlab {name}` has no option {flag}"
        for flag in flags
        if flag not in command_options[name]
    ]


def test_the_docs_pages_exist_and_the_readme_links_each():
    readme_links = set(re.findall(r"\]\((docs/[^)#]+)", (ROOT / "README.md").read_text()))
    pages = {f"docs/{page.name}" for page in DOC_FILES[1:]}
    assert pages, "no docs/*.md pages"
    assert pages <= readme_links, f"docs pages the README does not link: {sorted(pages - readme_links)}"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shown_command_uses_options_its_parser_has(path, command_options):
    commands = shown_commands(path.read_text())
    problems = [problem for command in commands for problem in command_problems(command, command_options)]
    assert problems == []


def test_the_checks_find_commands_and_catch_mistakes(command_options):
    text = "\n".join(
        [
            "Run `encoderlab experiment mlm --seeds 0` or `encoderlab predict`; `import encoderlab` is Python.",
            "```bash",
            "accelerate launch --config_file $(encoderlab config-path fsdp2) --num_processes 8 \\",
            "    -m encoderlab.cli pretrain --config run.yaml   # encoderlab --ignored in a comment",
            "```",
            "```python",
            "import encoderlab  # not a command",
            "```",
        ]
    )
    assert shown_commands(text) == [
        "config-path fsdp2",
        "pretrain --config run.yaml",
        "experiment mlm --seeds 0",
        "predict",
    ]
    assert command_problems("finetune --task sst2 --set data.path=x --bogus", command_options) == [
        "`encoderlab finetune --task sst2 --set data.path=x --bogus`: `encoderlab finetune` has no option --bogus"
    ]
    assert command_problems("experiment nosuch --seeds 0", command_options)
    assert command_problems("experiment mlm --seeds 0 --workers=2", command_options) == []
    assert github_anchor("Comparing checkpoints: `encoderlab experiment finetune`") == (
        "comparing-checkpoints-encoderlab-experiment-finetune"
    )
    assert "set-up" in anchors(ROOT / "README.md")
