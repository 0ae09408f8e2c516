"""A study spec from what a Python caller gives: a spec file's path or a dict, plus overrides.

Both go through the same checks as `hpolab study run SPEC key=value ...` (config/spec.py), so a bad
dict raises the same SpecError, naming the field, as the same spec in a file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, Union

SpecSource = Union[str, Path, Mapping[str, Any]]
Overrides = Union[Sequence[str], Mapping[str, Any], None]
DICT_SOURCE = "spec (dict)"  # how a SpecError names a dict spec


def override_strings(overrides: Overrides, new_study: str | None = None) -> list[str]:
    """`key=value` strings, as the command line has them: a list of such strings is kept; a dict
    (dotted key -> Python value) is written as key=<JSON> (JSON is YAML: the value reads back as
    given). `new_study`: the spec under another name (as `--new-study NAME`)."""
    if overrides is None:
        items: list[str] = []
    elif isinstance(overrides, Mapping):
        items = [f"{k}={_json_value(k, v)}" for k, v in overrides.items()]
    elif isinstance(overrides, str):
        items = [overrides]  # one "key=value" (a str is a Sequence: never split it into letters)
    elif isinstance(overrides, Iterable):
        items = [str(o) for o in overrides]
    else:
        from hpolab.errors import UserError

        raise UserError(f"overrides: {overrides!r} ({type(overrides).__name__}) is neither a dict of dotted keys to values nor a "
                        "list of 'key=value' strings; e.g. run_study(spec, {'n_trials': 5}) or run_study(spec, ['n_trials=5'])")
    # JSON-quoted: a YAML scalar like `1` or `yes` stays a string
    return items + ([f"name={json.dumps(new_study)}"] if new_study else [])


def _json_value(key: str, value: Any) -> str:
    """An override's value as JSON; numpy scalars and arrays (from a notebook's search) as their Python
    values; anything else JSON cannot write is one UserError naming the key."""
    from hpolab.errors import UserError

    def plain(v: Any) -> Any:
        if hasattr(v, "tolist"):  # numpy scalars and arrays, 0-d tensors
            return v.tolist()
        raise TypeError(type(v).__name__)

    try:
        return json.dumps(value, default=plain)
    except (TypeError, ValueError) as e:
        raise UserError(f"override {key!r}: a {e} value cannot be written to a spec; give numbers, strings, "
                        "booleans, None, lists or dicts") from None


def is_spec_file(spec: SpecSource) -> bool:
    return isinstance(spec, (str, Path))


def load(spec: SpecSource, overrides: list[str], project_dir: str | Path | None = None):
    """The validated StudySpec. A path is read as `hpolab study run` reads it; a dict is checked the
    same way, its experiment looked for in `project_dir` (default: the working directory)."""
    from hpolab.config.spec import load_spec, parse_overrides, spec_from_mapping
    from hpolab.errors import UserError

    if is_spec_file(spec):
        return load_spec(spec, overrides)
    if not isinstance(spec, Mapping):
        raise UserError(f"spec: give a spec file's path or a dict, not a {type(spec).__name__}")
    where = Path(project_dir).resolve() if project_dir is not None else Path.cwd()
    return spec_from_mapping(dict(spec), DICT_SOURCE, parse_overrides(overrides), search_from=where)


def study_name(name_or_spec: SpecSource) -> str:
    """A study named by a caller: its name, a spec file (its `name:`), or a spec dict (its "name")."""
    from hpolab.errors import SpecError, UserError

    if isinstance(name_or_spec, Mapping):
        name = name_or_spec.get("name")
        if not isinstance(name, str):
            raise SpecError(DICT_SOURCE, [f"name: missing or not a study name ({name!r})"])
        return name
    if isinstance(name_or_spec, Path) or str(name_or_spec).lower().endswith((".yaml", ".yml")):
        from hpolab.config.spec import study_name_from

        if not Path(name_or_spec).is_file():
            raise UserError(f"{name_or_spec}: no such spec file")
        return study_name_from(str(name_or_spec))
    if not isinstance(name_or_spec, str):
        raise UserError(f"a study name, a spec file or a spec dict, not a {type(name_or_spec).__name__}")
    return name_or_spec
