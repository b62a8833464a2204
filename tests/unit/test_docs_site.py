"""The front page and the documentation site: README.md stays short and holds the two commands, its
links land on pages of the site, every page is in the navigation, the generated reference covers every
command, option and config field, and the site builds with ``mkdocs build --strict``."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import typing

import pytest
import yaml
from pydantic import BaseModel

from tests.conftest import ROOT

DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return []


def _config_leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, field in model.model_fields.items():
        kinds = [field.annotation, *typing.get_args(field.annotation)]
        sections = [k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)]
        if sections:
            out += _config_leaves(sections[0], f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_readme_is_a_short_front_page_with_the_two_commands_first():
    lines = README.splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; the front page stays at about 200: move detail to docs/"
    before_first_section = README.split("\n## ", 1)[0]
    for command in ("make demo", "make test"):
        assert re.search(rf"^{command}\b", before_first_section, re.M), f"{command!r} is not among the first lines"


def test_readme_links_land_on_files_and_site_pages():
    nav = set(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))
    targets = [t for t in LINK.findall(README) if not re.match(r"[a-z]+://|#", t)]
    assert sum(t.startswith("docs/") for t in targets) >= 8, "the README should link into the site's pages"
    for target in targets:
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README.md links to {target}, which does not exist"
        if path.startswith("docs/") and path.endswith(".md"):
            assert path.removeprefix("docs/") in nav, f"README.md links to {path}, which is not in mkdocs.yml's nav"


def test_every_page_is_in_the_navigation_and_every_nav_entry_exists():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert sorted(p for p in nav if p not in pages) == [], "nav names pages that do not exist"
    assert sorted(pages - set(nav)) == [], "pages under docs/ missing from mkdocs.yml's nav"
    assert not (ROOT / "scripts" / "assemble_docs.py").exists() and not (DOCS / "fragments").exists()


def test_generated_markers_are_known_and_each_generator_is_used():
    hooks = _hooks()
    used = {m for p in DOCS.rglob("*.md") for m in hooks.MARKER.findall(p.read_text())}
    assert used == set(hooks.GENERATORS)
    with pytest.raises(ValueError, match="unknown generated block 'nope'"):
        hooks.expand("<!-- generated: nope -->\n", "x.md")


def test_cli_reference_lists_every_command_and_option():
    from trainperf.cli import build_parser

    text = _hooks().cli_markdown()

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, [*path, name])
            elif not isinstance(action, argparse._HelpAction) and action.help != argparse.SUPPRESS:
                yield path, action  # options hidden from --help stay hidden here too

    seen = 0
    for path, action in walk(build_parser(), ["trainperf"]):
        if len(path) > 1:
            assert f"`{' '.join(path)}`" in text, path
        section = text.split(f"`{' '.join(path)}`", 1)[1] if len(path) > 1 else text
        for flag in action.option_strings or [action.metavar or action.dest]:
            assert f"`{flag}`" in section, (path, flag)
        seen += 1
    assert seen > 50


def test_config_reference_lists_every_field_with_its_default():
    from trainperf.config.schema import Config

    text = _hooks().config_markdown()
    leaves = _config_leaves(Config)
    assert len(leaves) > 80
    for dotted in leaves:
        assert f"| `{dotted}` |" in text, dotted
    row = next(line for line in text.splitlines() if line.startswith("| `run.steps` |"))
    assert f"`{Config().run.steps}`" in row and "integer (>= 1)" in row


def test_rules_page_is_the_rule_table():
    from trainperf.diagnosis.rules import RULES

    page = _hooks().expand((DOCS / "concepts" / "diagnosis-rules.md").read_text())
    for rule in RULES:
        assert f"`{rule.id}`" in page


@pytest.mark.slow
def test_site_builds_strict(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("MkDocs is not installed (pip install -e '.[docs]'; the test extra includes it)")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stderr[-4000:]
    for page in ("reference/cli", "reference/config", "concepts/diagnosis-rules", "reference/api", "architecture"):
        html = (tmp_path / "site" / f"{page}.html").read_text()
        assert "<table>" in html or "doc-heading" in html or "One room per concern" in html, page
