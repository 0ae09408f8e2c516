"""pydantic's validation errors as the spec's one-line problems: `field.path: what is wrong`."""

from __future__ import annotations

import re

from pydantic import ValidationError

from hpolab.train.config import TrainConfig


def _pretty_loc(loc: tuple) -> str:
    parts = []
    for p in loc:
        # pydantic puts union tags and function names in the location; keep only user-facing keys.
        if isinstance(p, str) and (p in ("float", "int", "categorical", "asha", "pbt") or p.startswith("function-")):
            continue
        parts.append(str(p))
    return ".".join(parts) or "(top level)"


def validation_messages(err: ValidationError) -> list[str]:
    """One line per problem, its field path first (`trainer.lr: ...`)."""
    out = []
    for e in err.errors():
        msg = e["msg"]
        if e["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            msg = "unknown key (check the spelling; see docs/reference/spec.md)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        loc = _pretty_loc(e["loc"])
        # TrainConfig's own checks say "batch_size must be ..."; put the field into the path.
        first = msg.split(" ", 1)[0]
        if loc == "trainer" and first in TrainConfig.__dataclass_fields__:
            loc, msg = f"trainer.{first}", msg
        # a whole-spec check (objectives) names its own field: "pruning.metric: ..."
        out.append(msg if loc == "(top level)" and re.match(r"^[a-z_]+[\w.]*: ", msg) else f"{loc}: {msg}")
    return out
