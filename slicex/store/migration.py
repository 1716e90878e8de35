"""One way a store moves from an older layout to this slicex's: numbered steps run in order, each marked done
in the store (table `store-layout`) as soon as it finished.

Every step is idempotent (running it on a store it already brought forward, or half-way through, leaves the
store as running it once would), so a migration killed at any point (kill -9) is finished by the next run:
the step that was running runs again from its start, the ones marked done do not. Readers of this slicex read
both forms of what a step rewrites, so a half-migrated store is never misread meanwhile; a store whose mark is
behind is refused by every process but the one that migrates it (`check`), with the command that does.

`slicex up` runs `migrate` before any actor starts (deployment/migrations.py lists the steps); a store made
new is brought to the last step at once (every step finds nothing to do), so its mark says it is current."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slicex.errors import Refused

MARK_TABLE = "store-layout"
MARK_KEY = "steps"


@dataclass(frozen=True)
class Step:
    """One migration step: `run(store)` brings the store forward and returns how many documents it rewrote;
    it must be idempotent (see the module's docstring)."""

    number: int
    name: str
    run: Callable[[Any], int]


def layout_of(store: Any) -> int:
    """The number of the last step done on `store` (0: none, a store of the layout before this mechanism)."""
    doc = store.get(MARK_TABLE, MARK_KEY)
    return int(doc.get("done", 0)) if doc else 0


def pending(store: Any, steps: Sequence[Step]) -> list[Step]:
    done = layout_of(store)
    return [s for s in steps if s.number > done]


def migrate(store: Any, steps: Sequence[Step], say: Callable[[str], None] = lambda _line: None) -> list[tuple[str, int]]:
    """Run the steps not yet done, in order, marking each done right after it: (name, documents rewritten)
    per step run. Run by one process while no other process of the deployment runs (`slicex up`, before it
    starts any)."""
    numbers = [s.number for s in steps]
    if numbers != sorted(set(numbers)) or (numbers and numbers[0] < 1):
        raise ValueError(f"migration steps must be numbered 1, 2, ... in order: {numbers}")
    ran = []
    for step in pending(store, steps):
        rewritten = step.run(store)
        store.put(MARK_TABLE, MARK_KEY, {"done": step.number, "name": step.name})
        ran.append((step.name, rewritten))
        if rewritten:  # a store made new does every step at once, and has nothing to say about it
            say(f"store layout step {step.number} ({step.name}): {rewritten} documents rewritten")
    return ran


def check(store: Any, steps: Sequence[Step], shown: str) -> None:
    """Refuse a store whose layout is behind this slicex's, naming the command that migrates it: a process
    that is not the migrating one never reads a store it could misread."""
    behind = pending(store, steps)
    if behind:
        names = ", ".join(f"{s.number} {s.name}" for s in behind)
        raise Refused(f"the store {shown} has an older layout (steps not done: {names}); `slicex up` migrates it "
                      f"(stop every process of this deployment first)")
