"""MkDocs hook: the pages show the figures `python -m benchmarks.report` writes to results/plots/.

A page links a figure as `../results/plots/<name>.png`, the path that also works where the Markdown is read
in the repository; the hook adds every such figure to the site as `results/plots/<name>.png` and points those
links at it, so `mkdocs build --strict` checks them like any other link.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.structure.files import File

PLOTS = Path(__file__).resolve().parent / "results" / "plots"


def on_files(files, config):
    for figure in sorted(PLOTS.glob("*.png")):
        files.append(File(f"results/plots/{figure.name}", str(PLOTS.parents[1]), config["site_dir"],
                          config["use_directory_urls"]))
    return files


def on_page_markdown(markdown, page, config, files):
    return markdown.replace("](../results/plots/", "](results/plots/")
