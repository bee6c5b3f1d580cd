"""File helpers below every layer: atomic files, atomic folders, output-path checks, size-limited reads.

Every command's outputs go through here, so the guarantees of `docs/guarantees.md` hold in one place:

- `write_atomic(path, data)` — a reader (or a crash) sees the old content or the whole new one, never a
  part. A symlink is followed (it stays a link; its final target gets the content). A character device or a
  FIFO (`/dev/null`, `/dev/stdout`, a named pipe with a reader) is written in place, as a stream, never
  replaced by a regular file; other special files (sockets, block devices) are refused.
- `staged_folder(out, owns)` — an output folder built as a hidden sibling `.out.PID.new.tmp` and swapped in
  with one atomic `renameat2(RENAME_EXCHANGE)` (Linux), so a reader or a crash sees the old folder or the new,
  never a missing or mixed one. Where the exchange is not available the swap is two renames (out →
  `.out.PID.old.tmp`, new → out) and `recover_folder` (run at the start of every swap) finishes a swap a
  killed run left half-done or rolls back an unfinished build; either way no temporary folder of a dead run
  survives the next run.
  Files in an existing folder that the command does not write (`owns` says which) are refused, not deleted.
- `check_output_folder` / `check_output_file` — the path checks a command runs before any work.
- `read_text_limited(path, limit, field)` — regular files only, at most `limit` bytes, strict UTF-8, one-line
  errors naming the field.

Simplifications: liveness of a temporary's owner is its PID (`os.kill(pid, 0)`); a PID reused by an unrelated
process keeps that temporary until the PID is free again. Durability against power loss (fsync of the
folder) is not attempted: the guarantees are about processes killed or interrupted, which is what the fault
tests exercise.

This module imports nothing from layerpipe except `errors` (the layering test checks it).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from fnmatch import fnmatchcase
from pathlib import Path

from layerpipe.errors import InputError

#: Default size limit of a text input a user names (network YAML, schedule, sweep, profile, results files).
MAX_TEXT_BYTES = 64 * 1024 * 1024

_TMP_SUFFIX = ".tmp"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


# --------------------------------------------------------------------------------------------- one file


def _temp_name(name: str, tag: str) -> str:
    return f".{name}.{os.getpid()}.{tag}"


def _clean_stale_files(folder: Path, name: str) -> None:
    """Remove `.NAME.PID.*.tmp` files of dead processes (a run killed between mkstemp and rename)."""
    pattern = re.compile(rf"^\.{re.escape(name)}\.(\d+)\.[^/]*\.file{re.escape(_TMP_SUFFIX)}$")
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        match = pattern.match(entry.name)
        if match and not _pid_alive(int(match.group(1))) and entry.is_file(follow_symlinks=False):
            with suppress(OSError):
                os.unlink(entry.path)


def resolve_output(path: str | Path) -> Path:
    """The file an output path really names: symlinks followed to the end (a dangling link's target too)."""
    path = Path(path)
    seen = 0
    while path.is_symlink():
        seen += 1
        if seen > 40:
            raise InputError(f"cannot write {path}: too many levels of symbolic links")
        target = Path(os.readlink(path))
        path = target if target.is_absolute() else path.parent / target
    return path


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a file so that readers see either the old or the whole new content, never a part.

    A symlink stays a link (its target is written); a character device or FIFO is written in place; a socket
    or block device is refused. Errors are one line naming the path.
    """
    given = Path(path)
    payload = data.encode() if isinstance(data, str) else data
    target = resolve_output(given)
    try:
        st = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise InputError(f"cannot write {given}: {_reason(exc)}") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        _write_special(given, st, payload)
        return
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _clean_stale_files(target.parent, target.name)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=_temp_name(target.name, ""),
                                   suffix=".file" + _TMP_SUFFIX)
    except OSError as exc:
        raise InputError(f"cannot write {given}: {_reason(exc)}") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
        # mkstemp makes 0600: an existing file keeps its mode, a new one gets the ordinary 0666 & ~umask
        os.chmod(tmp, stat.S_IMODE(st.st_mode) if st is not None else 0o666 & ~_umask())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):  # a directory in the way, a full disk: the user's path, one line
            raise InputError(f"cannot write {given}: {_reason(exc)}") from None
        raise


def _write_special(given: Path, st: os.stat_result, payload: bytes) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"cannot write {given}: it is a directory")
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise InputError(f"cannot write {given}: a special file (socket or block device); give a regular file, "
                         "a character device or a FIFO")
    flags = os.O_WRONLY | (os.O_NONBLOCK if stat.S_ISFIFO(st.st_mode) else 0)
    try:
        fd = os.open(given, flags)  # the path itself: /dev/stdout resolves through /proc to a pipe
    except OSError as exc:
        if stat.S_ISFIFO(st.st_mode) and exc.errno == 6:  # ENXIO: nobody reads the FIFO; do not hang
            raise InputError(f"cannot write {given}: a FIFO with no reader") from None
        raise InputError(f"cannot write {given}: {_reason(exc)}") from None
    try:
        os.set_blocking(fd, True)
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view):]
    except OSError as exc:
        raise InputError(f"cannot write {given}: {_reason(exc)}") from None
    finally:
        os.close(fd)


def check_output_file(text: str) -> str:
    """An output FILE path, checked before any work: not empty, not a directory, not a socket/block device."""
    if not text.strip():
        raise InputError("must be a file path, got ''")
    target = resolve_output(text)
    if target.is_dir():
        raise InputError(f"must be a file path, got the directory '{text}'")
    try:
        st = os.stat(target)
    except OSError:
        return text
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise InputError(f"must be a regular file, a character device or a FIFO, got the special file '{text}'")
    return text


# --------------------------------------------------------------------------------------------- reading


def read_bytes_limited(path: str | Path, field: str, limit: int = MAX_TEXT_BYTES) -> bytes:
    """A regular file's bytes, at most `limit` (checked before reading, and again while reading)."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens without waiting for a writer
    except OSError as exc:
        raise InputError(f"{field} {path}: {_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{field} {path}: Is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{field} {path}: not a regular file (a device, FIFO or socket); give a file")
        if st.st_size > limit:
            raise InputError(f"{field} {path}: {st.st_size} bytes, more than the limit of {limit} bytes")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:  # the file grew while being read
                raise InputError(f"{field} {path}: more than the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as exc:
        raise InputError(f"{field} {path}: {_reason(exc)}") from None
    finally:
        os.close(fd)


def read_text_limited(path: str | Path, field: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A regular file as strict UTF-8 text, at most `limit` bytes; NUL bytes refused (text formats have none)."""
    raw = read_bytes_limited(path, field, limit)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{field} {path}: not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})") from None
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        raise InputError(f"{field} {path}: line {line}: a NUL byte; text files have none")
    return text


# --------------------------------------------------------------------------------------------- folders


def check_output_folder(text: str, owns: Callable[[str], bool], marker: str, what: str) -> str:
    """An --out folder that a command replaces as a whole, checked before any work.

    It must be new, empty, or an earlier output of the same command (it holds `marker` and only files the
    command writes, `owns(name)`): anything else would be moved aside and lost. `/`, `.`, `..` and any folder
    holding the current one are refused.
    """
    if not text.strip():
        raise InputError("must be a folder path, got ''")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise InputError(f"must be a folder, got the file '{text}'")
    if Path.cwd().resolve().is_relative_to(path.resolve()):
        raise InputError(f"must not be the current folder or one above it, got '{text}'")
    if not path.exists():
        check_creatable(path, f"'{text}'")
    if path.is_dir():
        names = sorted(entry.name for entry in path.iterdir())
        if names and marker not in names:
            raise InputError(f"'{text}' holds files but no {what} ({marker}); give a new or empty folder, "
                             f"or an earlier {what}'s, since the folder is replaced")
        foreign = [name for name in names if not owns(name)]
        if foreign:
            raise InputError(f"'{text}' holds '{foreign[0]}', which {what} does not write; move it away "
                             "(the folder is replaced whole and it would be lost)")
    return text


def check_creatable(path: str | Path, what: str) -> None:
    """Before any work: a folder that does not exist yet can be created (its nearest existing ancestor is a
    folder this process can write in). Probed by creating and removing a hidden temporary folder there, since
    access() says yes to root on read-only or virtual file systems (/proc)."""
    probe = Path(path).absolute()
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{what}: cannot create it: {probe} is a file")
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".layerpipe-probe.", suffix=_TMP_SUFFIX))
    except OSError as exc:
        raise InputError(f"{what}: cannot create it in {probe}: {_reason(exc)}") from None


def owns_names(*patterns: str) -> Callable[[str], bool]:
    """`owns` for `staged_folder`: a name matches one of the glob patterns."""
    return lambda name: any(fnmatchcase(name, p) for p in patterns)


def _folder_temps(out: Path) -> Iterator[tuple[int, str, Path]]:
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(\d+)\.(new|old){re.escape(_TMP_SUFFIX)}$")
    try:
        entries = list(os.scandir(out.parent))
    except OSError:
        return
    for entry in sorted(entries, key=lambda e: e.name):
        match = pattern.match(entry.name)
        if match:
            yield int(match.group(1)), match.group(2), Path(entry.path)


def recover_folder(out: str | Path) -> None:
    """Finish or roll back a swap of `out` that a dead process left half-done; delete its temporaries.

    The swap renames out → old only after new is complete, so: old present and out missing means new is
    complete (rename it in) or already gone (put old back); old present and out present means the swap is
    done (delete old); new without old means the build was interrupted (delete new).
    """
    out = Path(out).absolute()
    groups: dict[int, dict[str, Path]] = {}
    for pid, kind, path in _folder_temps(out):
        groups.setdefault(pid, {})[kind] = path
    for pid in sorted(groups):
        if _pid_alive(pid):
            continue  # a run in progress (another process): not ours to touch
        temps = groups[pid]
        old, new = temps.get("old"), temps.get("new")
        if old is not None and not out.exists():
            if new is not None:  # killed between the two renames: finish the swap
                os.replace(new, out)
                shutil.rmtree(old, ignore_errors=True)
            else:  # the new folder is gone (removed by hand): roll back
                os.replace(old, out)
            continue
        for temp in (old, new):
            if temp is not None:
                shutil.rmtree(temp, ignore_errors=True)


@contextmanager
def staged_folder(out: str | Path, owns: Callable[[str], bool] | None = None,
                  field: str = "--out") -> Iterator[Path]:
    """Build an output folder: yields a hidden empty sibling to fill; on normal exit it replaces `out`.

    On any exception the sibling is deleted and `out` is untouched. Before the swap, an existing `out` holding
    files the command does not write (`owns` false) is refused: they are never deleted.
    """
    out = Path(out).absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        recover_folder(out)
        new = out.with_name(_temp_name(out.name, "new" + _TMP_SUFFIX))
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir(mode=0o777 & ~_umask())  # an ordinary folder, not mkdtemp's private one
        os.chmod(new, 0o777 & ~_umask())
    except OSError as exc:
        raise InputError(f"{field} {out}: cannot create a folder beside it: {_reason(exc)}") from None
    try:
        yield new
        _swap(new, out, owns, field)
    except BaseException:
        shutil.rmtree(new, ignore_errors=True)
        raise


def _swap(new: Path, out: Path, owns: Callable[[str], bool] | None, field: str) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"{field} {out} exists and is not a folder")
    old = out.with_name(_temp_name(out.name, "old" + _TMP_SUFFIX))
    if out.exists():
        if owns is not None:
            foreign = sorted(name for name in os.listdir(out) if not owns(name))
            if foreign:
                raise InputError(f"{field} {out} holds '{foreign[0]}', which this command does not write; "
                                 "move it away (the folder is replaced whole)")
        if _exchange(new, out):  # one atomic step: out is the new folder, `new` the old one
            os.replace(new, old)
        else:  # no renameat2: two renames, the window between them closed by `recover_folder`
            os.replace(out, old)
            os.replace(new, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, out)


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (38, 22, 95, 18):  # ENOSYS, EINVAL (file system cannot), EOPNOTSUPP, EXDEV: fall back
        return False
    raise OSError(errno, os.strerror(errno), str(b))


def temporaries(folder: str | Path) -> list[Path]:
    """Hidden temporaries of this module in `folder` (for tests: none may survive a finished run)."""
    return sorted(p for p in Path(folder).iterdir() if p.name.startswith(".") and p.name.endswith(_TMP_SUFFIX))



def parse_json_text(text: str, field: str) -> object:
    """JSON text as Python values; a syntax error or nesting beyond the recursion limit is one line."""
    import json

    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{field}: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise InputError(f"{field}: JSON nested too deeply") from None


def read_json_limited(path: str | Path, field: str, limit: int = MAX_TEXT_BYTES) -> object:
    """A JSON file read by `read_text_limited` and `parse_json_text`."""
    return parse_json_text(read_text_limited(path, field, limit), f"{field} {path}")
