"""The docs are part of the interface: the settings table must match the one settings class,
every link between the README and docs/ must land on a file and a heading that exist, and the
README stays a short front door."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from pending_actions.broker.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SETTINGS_PAGE = ROOT / "docs" / "configuration.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
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


def test_the_readme_stays_short() -> None:
    # the front door (issue 30): what it is, how to start, where the docs are; the rest is docs/
    size = (ROOT / "README.md").stat().st_size
    assert size <= 15_000, f"README.md is {size} bytes: move detail into docs/ and link to it"


# Links: [text](target) and ![alt](target) inline, and [label]: target reference definitions.
INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The text with code blocks and code spans blanked: a link shown as code is not a link."""
    text = FENCE.sub("", text)
    return CODE_SPAN.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lowercase, punctuation but '-' and '_'
    dropped, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in HEADING.finditer(FENCE.sub("", page.read_text())):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links_in(markdown: str) -> list[str]:
    text = prose(markdown)
    return [*INLINE.findall(text), *REFERENCE.findall(text)]


def links(page: Path) -> list[str]:
    return links_in(page.read_text())


def test_slugs_follow_github() -> None:
    assert slug("Why a task takes a hop (`REPLICA_WAIT`, off)") == \
        "why-a-task-takes-a-hop-replica_wait-off"
    assert slug("resolve(session, action, reason, extra=None)") == \
        "resolvesession-action-reason-extranone"
    assert slug("People in the loop: the inbox and the HTTP API") == \
        "people-in-the-loop-the-inbox-and-the-http-api"


def test_the_link_check_finds_links() -> None:
    # a check that finds nothing would pass for ever
    found = [target for page in PAGES for target in links(page)]
    assert "docs/semantics.md" in found
    assert any("#" in target for target in found)
    assert links_in("[a](x.md) `[b](y.md)` [c][d]\n\n[d]: z.md#top\n```\n[e](w.md)\n```\n") \
        == ["x.md", "z.md#top"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands(page: Path) -> None:
    broken: list[str] = []
    for target in links(page):
        if EXTERNAL.match(target):
            continue
        path, _, anchor = target.partition("#")
        path = unquote(path)
        if not target:
            broken.append("an empty link")
            continue
        if path.startswith("/"):
            broken.append(f"{target}: absolute path (write it relative to {page.name})")
            continue
        dest = (page.parent / path).resolve() if path else page
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            broken.append(f"{target}: no heading with that anchor in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)
