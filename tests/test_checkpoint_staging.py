"""The driver's periodic checkpoint upload (uploads.stage_checkpoints): last.pt every time, best.pt only
when it is another file than the one uploaded last. "Another file" was the inode number alone, and ext4
gives a freed number to the next new file at once: a new best.pt often looked like the uploaded one, and
a pause or a retry on another worker fetched an old best.pt. Now the identity includes the file's
modification time and size."""

from __future__ import annotations

import os
import shutil

from hpolab.study.trials.uploads import stage_checkpoints


def _write(path, data: bytes, mtime_ns: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def _staged(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_best_pt_is_staged_again_only_when_it_is_another_file(tmp_path):
    _write(tmp_path / "last.pt", b"epoch 1", 1_000_000_000)
    os.link(tmp_path / "last.pt", tmp_path / "best.pt")
    folder, best = stage_checkpoints(tmp_path, 1, None)
    assert _staged(folder) == ["best.pt", "last.pt"]
    shutil.rmtree(folder)

    _write(tmp_path / "last.pt", b"epoch 2", 2_000_000_000)  # not better: best.pt is still epoch 1's file
    folder, best = stage_checkpoints(tmp_path, 2, best)
    assert _staged(folder) == ["last.pt"]
    shutil.rmtree(folder)


def test_a_new_best_pt_with_the_uploaded_ones_inode_number_is_staged(tmp_path):
    """The same inode number, new content (what a reused number looks like to the driver): staged."""
    _write(tmp_path / "last.pt", b"epoch 1", 1_000_000_000)
    (tmp_path / "best.pt").write_bytes(b"epoch 1")
    os.utime(tmp_path / "best.pt", ns=(1_000_000_000, 1_000_000_000))
    folder, best = stage_checkpoints(tmp_path, 1, None)
    shutil.rmtree(folder)
    number = (tmp_path / "best.pt").stat().st_ino

    with open(tmp_path / "best.pt", "wb") as f:  # the same number, the content of a later best epoch
        f.write(b"epoch 3, better")
    os.utime(tmp_path / "best.pt", ns=(3_000_000_000, 3_000_000_000))
    assert (tmp_path / "best.pt").stat().st_ino == number
    folder, _ = stage_checkpoints(tmp_path, 3, best)
    assert _staged(folder) == ["best.pt", "last.pt"]
    assert (folder / "best.pt").read_bytes() == b"epoch 3, better"
