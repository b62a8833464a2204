"""MkDocs hook: the site's generated pages, written at build time from the code itself.

A page holds a marker line ``<!-- generated: NAME -->``; ``on_page_markdown`` replaces it with
``GENERATORS[NAME]()``:

- ``cli``: every ``trainperf`` subcommand from the argparse parser (``trainperf.cli.build_parser``):
  usage, description and a table of its arguments;
- ``config``: every config field from the JSON Schema of the config (``Config.model_json_schema()``,
  whose descriptions are the fields' docstrings): dotted name, type and range, default, description;
- ``rules``: the diagnosis rules table (``trainperf.diagnosis.rules.rules_markdown``).

So the reference cannot drift from the code: a new option or field appears at the next build. An
unknown marker fails the build. Used by ``mkdocs.yml`` (``hooks:``) and by
``tests/unit/test_docs_site.py``, which calls the generators without MkDocs.
"""

from __future__ import annotations

import argparse
import json
import os
import re

MARKER = re.compile(r"^<!-- generated: ([a-z_]+) -->[ \t]*$", re.M)


def _cell(text) -> str:
    """One Markdown table cell: one line, pipes escaped, ``<`` outside code spans escaped (not HTML)."""
    parts = " ".join(str(text).split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def _rst_to_md(text: str) -> str:
    return text.replace("``", "`")


# --------------------------------------------------------------------------- CLI
def _subparsers(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps no public list of them
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, sub, helps.get(name)


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    names = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        names += f" `{metavar if isinstance(metavar, str) else ' '.join(metavar)}`"
    return names


def _default(action: argparse.Action) -> str:
    if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or action.default == []:
        return ""
    return f"`{action.default}`"


def _command_markdown(path: list[str], parser: argparse.ArgumentParser, help_text, level: int) -> list[str]:
    out = [f"{'#' * level} `{' '.join(path)}`", ""]
    if help_text:
        out += [_rst_to_md(help_text[0].upper() + help_text[1:]) + ".", ""]
    usage = parser.format_usage().strip().removeprefix("usage: ").splitlines()
    usage = [usage[0], *(line[len("usage: "):] if line.startswith(" " * 7) else line for line in usage[1:])]
    out += ["```", *usage, "```", ""]
    if parser.description and parser.description.strip() != (help_text or "").strip():
        out += [_rst_to_md(parser.description.strip()), ""]
    rows = [a for a in parser._actions
            if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) and a.help != argparse.SUPPRESS]
    if rows:
        out += ["| argument | default | what it does |", "|---|---|---|"]
        for a in rows:
            choices = f" (one of: {', '.join(map(str, a.choices))})" if a.choices else ""
            out.append(f"| {_flags(a)} | {_default(a)} | {_cell(_rst_to_md(a.help or '') + choices)} |")
        out.append("")
    for name, sub, sub_help in _subparsers(parser):
        out += _command_markdown([*path, name], sub, sub_help, min(level + 1, 6))
    return out


def cli_markdown() -> str:
    from trainperf.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps usage lines to the terminal: the same page on every machine
    try:
        root = build_parser()
        lines = []
        for name, sub, help_text in _subparsers(root):
            lines += _command_markdown(["trainperf", name], sub, help_text, 2)
    finally:
        if columns is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = columns
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- config
def _resolve(node: dict, defs: dict) -> dict:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if ref else node


def _one_type(node: dict) -> str:
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return " \\| ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type", "any")
    bounds = []
    for key, sym in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"),
                     ("minLength", "length >=")):
        if key in node:
            bounds.append(f"{sym} {node[key]:g}" if isinstance(node[key], float) else f"{sym} {node[key]}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def _type(node: dict, defs: dict) -> str:
    options = node.get("anyOf") or node.get("oneOf") or [node]
    return " \\| ".join(_one_type(_resolve(o, defs)) if "$ref" not in o else "section" for o in options)


def _section_ref(node: dict) -> dict | None:
    refs = [o for o in (node.get("anyOf") or [node]) if "$ref" in o]
    return refs[0] if refs else None


def _sections(schema: dict, defs: dict, prefix: str, node: dict | None = None):
    """(dotted prefix, section schema, its description) of every section, in the schema's order, parents first."""
    node = node or {}
    description = node.get("description") or schema.get("description", "")
    if any(o.get("type") == "null" for o in node.get("anyOf", [])):
        description += f" Optional: absent by default (`{json.dumps(node.get('default'))}`)."
    yield prefix, schema, description.strip()
    for name, child in schema.get("properties", {}).items():
        ref = _section_ref(child)
        if ref is not None:
            yield from _sections(_resolve(ref, defs), defs, f"{prefix}{name}.", child)


def config_markdown() -> str:
    from trainperf.config.schema import Config

    schema = Config.model_json_schema()
    defs = schema.get("$defs", {})
    lines = []
    for prefix, section, description in _sections(schema, defs, ""):
        if not prefix:
            continue  # the root only lists the sections, which follow
        fields = section.get("properties", {})
        leaves = {n: f for n, f in fields.items() if _section_ref(f) is None}
        subs = [n for n in fields if n not in leaves]
        lines += [f"## `{prefix.rstrip('.')}`", ""]
        if description:
            lines += [_cell(description), ""]
        if subs:
            lines += ["Sections: " + ", ".join(f"[`{prefix}{n}`](#{(prefix + n).replace('.', '')})" for n in subs), ""]
        if leaves:
            lines += ["| field | type | default | description |", "|---|---|---|---|"]
            for name, node in leaves.items():
                default = json.dumps(node["default"]) if "default" in node else "(required)"
                lines.append(f"| `{prefix}{name}` | {_type(node, defs)} | `{_cell(default)}` | "
                             f"{_cell(node.get('description', ''))} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


# --------------------------------------------------------------------------- rules
def rules_markdown() -> str:
    from trainperf.diagnosis.rules import rules_markdown as table

    return table().rstrip() + "\n"


GENERATORS = {"cli": cli_markdown, "config": config_markdown, "rules": rules_markdown}


def expand(markdown: str, where: str = "page") -> str:
    """The markdown with every marker replaced; an unknown marker is an error naming the known ones."""
    def sub(m: re.Match) -> str:
        name = m.group(1)
        if name not in GENERATORS:
            raise ValueError(f"{where}: unknown generated block {name!r}; known: {', '.join(sorted(GENERATORS))}")
        return GENERATORS[name]()

    return MARKER.sub(sub, markdown)


def on_page_markdown(markdown, page, config, files):  # MkDocs hook
    return expand(markdown, page.file.src_uri)
