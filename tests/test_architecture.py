"""docs/architecture.md, the map of the package, names every module of it: a module added, moved or
renamed without the map fails here."""

from __future__ import annotations

from tests.test_house import FLOORS, PACKAGE, WINGS

MAP = PACKAGE.parent / "docs" / "architecture.md"


def test_every_module_is_on_the_map() -> None:
    text = MAP.read_text()
    named = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))]
    # a module by its path in backquotes; a wing's door also by the link to it
    missing = [name for name in named if f"`{name}`" not in text and f"](../redlock_async/{name})" not in text]
    assert missing == [], "modules missing from docs/architecture.md: " + ", ".join(missing)


def test_every_wing_has_its_row_in_floor_order() -> None:
    """The table's floors are test_house's FLOORS, in the same order."""
    rows = [line for line in MAP.read_text().splitlines() if line.startswith("| ") and line[2].isdigit()]
    drawn = [row.split("|")[2] for row in rows]
    for wing in (*WINGS, "_scripts"):
        (number,) = [i for i, names in enumerate(FLOORS) if wing in names]
        assert f"`{wing}/`" in drawn[number], (wing, number, drawn[number])
