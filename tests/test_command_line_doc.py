"""docs/command-line.md's table of flags against the argument dataclasses: every field of train.py's and
train_ray.py's arguments has a row, and every flag a row names is one of them (or a boolean's --no- form)."""

import dataclasses
import re
from pathlib import Path

import train_ray

PAGE = Path(__file__).resolve().parents[1] / "docs" / "command-line.md"


def table_flags() -> set[str]:
    """The flags named in the first column of the page's Flags table."""
    section = PAGE.read_text().split("\n## Flags\n")[1].split("\n## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| `--")]
    return {flag for row in rows for flag in re.findall(r"`(--[a-z0-9-]+)`", row.split("|")[1])}


def test_every_argument_has_a_row_and_every_row_names_an_argument():
    fields = {f"--{f.name.replace('_', '-')}": f for f in dataclasses.fields(train_ray.RayArgs)}
    named = table_flags()
    assert sorted(set(fields) - named) == []
    negated = {flag for flag in named if flag.startswith("--no-")}
    assert sorted(named - set(fields) - negated) == []
    for flag in negated:
        field = fields.get("--" + flag.removeprefix("--no-"))
        assert field is not None and field.type in (bool, "bool"), flag
