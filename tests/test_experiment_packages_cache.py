"""Which distribution owns which module is read once per set of installed distributions, then from the cache."""

from __future__ import annotations

import json
import sys
from importlib import metadata

from hpolab.stores.experiment_packages import package_owners


def test_the_module_owners_come_from_the_cache_until_what_is_installed_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("HPOLAB_CACHE", str(tmp_path / "cache"))
    first = package_owners()
    assert first == {name: list(dists) for name, dists in metadata.packages_distributions().items()}
    (cached,) = (tmp_path / "cache").glob("packages-*.json")
    assert json.loads(cached.read_text()) == first

    # The next call reads the file (what it says is what comes back), not the installed distributions.
    cached.write_text(json.dumps({**first, "torch": ["a-renamed-torch"]}))
    assert package_owners()["torch"] == ["a-renamed-torch"]

    # A distribution installed on sys.path is another key: the distributions are read again.
    site = tmp_path / "site"
    (site / "tiny_dist-1.0.dist-info").mkdir(parents=True)
    (site / "tiny_dist-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-dist\nVersion: 1.0\n")
    (site / "tiny_dist-1.0.dist-info" / "top_level.txt").write_text("tiny_mod\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    again = package_owners()
    assert again["tiny_mod"] == ["tiny-dist"] and again["torch"] == first["torch"]
    assert len(list((tmp_path / "cache").glob("packages-*.json"))) == 2
