"""`key=value` overrides from the command line, applied to a spec's raw YAML before validation."""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

from hpolab.errors import SpecError


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """`a.b=value` strings -> {"a.b": yaml-typed value}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key or not re.match(r"^[A-Za-z_][\w]*(\.[\w]+)*$", key):
            raise SpecError("command line", [f"override {item!r}: write key=value with a dotted key, e.g. trainer.lr=0.01"])
        try:
            out[key] = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError as e:
            raise SpecError("command line", [f"override {key}: value {raw!r} is not valid YAML ({e.problem})"]) from None
    return out


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(raw)
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        # search_space keys are themselves dotted ("trainer.lr"): search_space.trainer.lr.high=0.1
        if parts[0] == "search_space" and len(parts) >= 3:
            ss = node.setdefault("search_space", {})
            sp_key = ".".join(parts[1:3])
            if len(parts) == 3:
                ss[sp_key] = value
            else:
                target = ss.setdefault(sp_key, {})
                for p in parts[3:-1]:
                    target = target.setdefault(p, {})
                target[parts[-1]] = value
            continue
        for p in parts[:-1]:
            nxt = node.get(p)
            if nxt is None:
                nxt = node[p] = {}
            if not isinstance(nxt, dict):
                raise SpecError("command line", [f"override {key}: {p} is not a section"])
            node = nxt
        node[parts[-1]] = value
    return data
