"""Folders and files on the controller that only this user may use.

A folder under a shared ``/tmp`` that another user made first, or a symlink planted there, would
hand them every secret passing through it (the ssh master sockets carry the nodes' env files).
So a folder is made 0700, or checked with ``lstat`` when it exists: this user's real directory
is narrowed to 0700, anything else refused; nothing is "repaired" in someone else's folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sparkfleet.errors import StateError


def _check(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise StateError(f"{path} is a symlink, not a private folder of this user: refusing to use it (remove it)")
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(f"{path} is not a folder: refusing to use it (remove it)")
    if st.st_uid != os.getuid():
        raise StateError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}): refusing to use it "
            "(another user may have made it to receive this user's secrets; remove it)"
        )
    if st.st_mode & 0o077:
        # This user's own folder, made by an older sparkfleet or a plain mkdir: narrowed, not refused.
        try:
            os.chmod(path, 0o700, follow_symlinks=False)
        except (OSError, NotImplementedError) as exc:
            raise StateError(f"{path} is open to other users and cannot be made private: {exc}") from exc


def private_dir(path: Path | str, *, parents: bool = False) -> Path:
    """path as a folder only this user can enter: made 0700 when missing, else checked.
    With parents, missing parents are made too (0700 as well: they are this user's)."""
    path = Path(path)
    if parents and not path.parent.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # the umask may only take bits away
    except FileExistsError:
        pass
    except OSError as exc:
        raise StateError(f"cannot make the folder {path}: {exc.strerror or exc}") from exc
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise StateError(f"cannot read the folder {path}: {exc.strerror or exc}") from exc
    _check(path, st)
    return path


def private_file(path: Path | str) -> Path:
    """path as a file only this user can read: created 0600 if missing (never through a
    symlink), its mode narrowed to 0600 if this user owns it, refused otherwise."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StateError(f"cannot open {path} as a private file: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise StateError(f"{path} belongs to uid {st.st_uid}, not to this user: refusing to use it (remove it)")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def open_private_append(path: Path | str) -> int:
    """A descriptor appending to path, a 0600 file of this user (a log)."""
    private_file(path)
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
