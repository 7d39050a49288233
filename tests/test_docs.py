"""The docs are part of the interface: the settings table must match the one settings class."""

from __future__ import annotations

import re
from pathlib import Path

from pending_actions.broker.settings import Settings

SETTINGS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
ROW = re.compile(r"^\| `([A-Z_]+)`(?: / `([A-Z_]+)`)? \| ([^|]+) \|")


def documented() -> dict[str, str]:
    """Variable name (without the prefix) -> default as written in the settings page's table.
    The page holds that one table: a row that is not a setting fails the check below."""
    table: dict[str, str] = {}
    for line in SETTINGS_PAGE.read_text().splitlines():
        m = ROW.match(line)
        if not m:
            continue
        names = [n for n in m.group(1, 2) if n]
        defaults = [d.strip() for d in m.group(3).split(" / ")]
        assert len(defaults) == len(names), f"row {line!r}: one default per variable"
        table.update(zip(names, defaults, strict=True))
    return table


def shown(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int):
        return f"{value}"
    return str(value)


def test_the_settings_table_lists_every_setting_with_its_default() -> None:
    table = documented()
    fields = Settings.model_fields
    wanted = {name.upper(): field.default for name, field in fields.items()}
    assert sorted(table) == sorted(wanted), "settings table and Settings differ"
    for name, default in wanted.items():
        written = table[name]
        if name == "DRAMATIQ_URL":
            assert written == "`REDIS_URL`"  # unset means: the same Redis
            continue
        assert written.strip("`") == shown(default), f"{name}: the settings table says {written}"
