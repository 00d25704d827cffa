"""The documentation site builds with MkDocs in strict mode (a broken link or a page left out of the navigation
fails), the citation file is valid CFF, and every command of the README runs as written."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.commands import run_python
from tests.conftest import ROOT


def test_the_docs_site_builds_strict_with_every_page_in_its_navigation(tmp_path):
    pytest.importorskip("mkdocs", reason="the [docs] extra installs MkDocs")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    navigation = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    listed = {page for entry in navigation for page in entry.values()}
    assert listed == {path.name for path in (ROOT / "docs").glob("*.md")}  # no page left out, none missing


def test_the_licence_and_citation_are_there():
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    citation = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert citation["cff-version"] == "1.2.0" and citation["license"] == "MIT"
    assert {"title", "authors", "message", "version"} <= set(citation)


def readme_commands() -> list[str]:
    """Every command of README.md, one per `&&` part, comments and quotes dropped: each line of its bash blocks,
    and each inline code span of its prose that starts with `python ` or `pip ` (a span may wrap a line)."""
    import re
    import shlex

    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        lines += [line.split(" #", 1)[0].strip() for line in block.splitlines()]
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    lines += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose) if span.startswith(("python ", "pip "))]
    commands = []
    for line in lines:
        if line and not line.startswith("#"):
            commands += [" ".join(shlex.split(part)) for part in line.split("&&")]
    return commands


def run_overrides(command: str) -> list[str]:
    """The config overrides of a `python run.py` command as one of its jobs composes them: the first value of a
    sweep's list, Hydra's own launcher settings left to Hydra (its sweeper kept: a study's +tune=<round> sets it)."""
    import re

    overrides = []
    for word in command.split()[2:]:
        if word == "-m" or (word.startswith("hydra") and not word.startswith("hydra/sweeper=")):
            continue
        key, value = word.split("=", 1)
        overrides.append(f"{key}={value if value.startswith('[') else re.split(r',', value)[0]}")
    return overrides


@pytest.mark.slow
def test_every_command_of_the_readme_runs_as_written():
    """run.py commands compose and pass the config's validation (what a run does before training); `python -m`
    tools parse their arguments (--help exits 0); pip installs name extras that exist."""
    import tomllib

    from benchmarks.engine.config import compose_config
    from benchmarks.engine.validate import validate_config

    commands = readme_commands()
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    checked = {"run.py": 0, "-m": 0, "pip": 0}
    for command in commands:
        words = command.split()
        if words[:2] == ["python", "run.py"]:
            validate_config(compose_config(run_overrides(command)))
            checked["run.py"] += 1
        elif words[:2] == ["python", "-m"]:
            result = run_python([sys.executable, "-m", words[2], "--help"], cwd=ROOT, capture_output=True,
                                text=True, timeout=120)
            assert result.returncode == 0, (command, result.stderr[-1000:])
            checked["-m"] += 1
        elif words[:3] == ["mkdocs", "build", "--strict"]:
            continue  # test_the_docs_site_builds_strict_with_every_page_in_its_navigation runs it
        elif words[:2] == ["pip", "install"]:
            for spec in words[2:]:
                if spec.startswith(".["):
                    assert set(spec[2:-1].split(",")) <= extras, command
            checked["pip"] += 1
        else:
            raise AssertionError(f"a README command this test does not know how to check: {command}")
    assert checked["run.py"] >= 5 and checked["-m"] >= 5 and checked["pip"] >= 4, checked


def markdown_rows(lines: list[str]) -> list[list[str]]:
    """A Markdown table's rows as cells (the separator row left out); a README's tuning-task mark `*` dropped."""
    rows = []
    for line in lines:
        cells = [cell.strip().replace("*", "") for cell in line.strip().strip("|").split("|")]
        if not all(set(cell) <= set(":-") for cell in cells):
            rows.append(cells)
    return rows


def test_the_readmes_headline_tables_are_what_their_command_prints():
    """Each README table introduced by `python -m benchmarks.report --headline <tables>` holds, cell for cell, what
    that command prints from the committed tables: a result changed without its README table fails here."""
    import itertools
    import re

    from benchmarks.report import headline

    text = (ROOT / "README.md").read_text()
    commands = list(re.finditer(r"`python -m benchmarks\.report --headline ([^`]+)`", text))
    assert len(commands) >= 2, "the README's headline tables name their command"
    for command in commands:
        following = text[command.end():].splitlines()
        start = next(i for i, line in enumerate(following) if line.startswith("|"))
        table = list(itertools.takewhile(lambda line: line.startswith("|"), following[start:]))
        printed = headline([ROOT / path for path in command.group(1).split()])
        assert markdown_rows(table) == markdown_rows(printed.splitlines()), command.group(0)
