"""scripts/docs_images.py (`scripts/docs images`) makes every screenshot of the docs from a study it runs:
here a small one (--quick), into a temporary folder, with the real `hpolab ui` and Debian's Chromium.
The script checks each page shows what its caption says before it takes the picture."""

from __future__ import annotations

import importlib.util
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, hpolab_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium at /usr/bin/chromium (scripts/system-deps)"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="needs the playwright package"),
]


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_the_script_makes_every_screenshot_from_a_study(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_images

    out = tmp_path / "img"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_images.py"), "--quick", "--store", str(tmp_path / "store"),
                           "--out", str(out)], cwd=tmp_path, env=hpolab_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in out.glob("*.png")) == sorted(docs_images.IMAGES)
    for name in docs_images.IMAGES:
        width, height = _png_size(out / name)
        assert width >= 1200 and height >= 700 and (out / name).stat().st_size > 20_000, name
        assert f"wrote {out / name}" in proc.stdout
