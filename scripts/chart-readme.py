#!/usr/bin/env python3
"""Generates deploy/helm/tidemark/README.md from the chart's values.yaml: every value, its
default and the comments that describe it (the comment lines above a key, and its inline
comment with any indented continuation). Prints it; scripts/gen-deploy.sh writes it, and
crates/operator/tests/deploy.rs checks the committed file is what this prints."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "tidemark"

KEY = re.compile(r"^(\s*)([A-Za-z][\w.-]*):(?:\s+(.*))?$")


def split_comment(rest):
    """A value and its inline comment: the first `#` after a blank outside quotes."""
    quote = None
    for i, c in enumerate(rest):
        if quote:
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif c == "#" and (i == 0 or rest[i - 1].isspace()):
            return rest[:i].strip(), rest[i + 1 :].strip()
    return rest.strip(), ""


def rows(text):
    out = []  # [path, default, [description parts]]
    stack = []  # (indent, key)
    pending = []
    last = None  # (row, column of its inline comment) for continuations
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            pending, last = [], None
            continue
        if stripped.startswith("#"):
            column = len(line) - len(line.lstrip())
            comment = stripped[1:].strip()
            if last is not None and column >= last[1] > 0:
                last[0][2].append(comment)
            else:
                pending.append(comment)
                last = None
            continue
        m = KEY.match(line)
        if not m:
            # A list item or a flow continuation belongs to the key above.
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        value, inline = split_comment(m.group(3) or "")
        path = ".".join([k for _, k in stack] + [m.group(2)])
        row = [path, value, list(pending)]
        if inline:
            row[2].append(inline)
        out.append(row)
        pending = []
        last = (row, line.find("#", len(m.group(1)) + len(m.group(2)) + 1) if inline else 0)
        if not value:
            stack.append((indent, m.group(2)))
    return out


def cell(text):
    """Text for a table cell: pipes escaped, and `<…>` shown rather than read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def main():
    values = (CHART / "values.yaml").read_text()
    lines = [
        "# Tidemark's Helm chart",
        "",
        "<!-- Generated from values.yaml by scripts/chart-readme.py (scripts/gen-deploy.sh); do not edit. -->",
        "",
        "The Tidemark operator: backup schedules, retention that keeps the recovery window,",
        "crash-safe deletion, restores and restore tests for databases on Kubernetes.",
        "",
        "```sh",
        "helm install tidemark deploy/helm/tidemark --namespace tidemark-system --create-namespace \\",
        "  --set image.repository=<registry>/tidemark",
        "```",
        "",
        "The operator's guide is [docs/operator.md](../../../docs/operator.md) (install, upgrade,",
        "CRDs on `helm upgrade` with `crds.managed`, monitoring, sharing between teams);",
        "`values.schema.json` refuses a misspelt key or a value of the wrong form.",
        "",
        "## Values",
        "",
        "| Key | Default | Description |",
        "|---|---|---|",
    ]
    for path, default, description in rows(values):
        shown = f"`{cell(default)}`" if default else ""
        lines.append(f"| `{path}` | {shown} | {cell(' '.join(description))} |")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
