"""The documentation site builds with MkDocs in strict mode (a broken link or a page left out of the navigation
fails), and the citation file is valid CFF."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

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
