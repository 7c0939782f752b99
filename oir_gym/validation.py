"""Argument checks at the public boundary: errors start with the argument's name and say what is allowed.

A wrong type raises :class:`ArgumentTypeError` (a ``TypeError`` that is also a ``ValueError``), a value
out of range ``ValueError``. Booleans are never numbers and numbers never booleans; numpy scalars count.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

import numpy as np

__all__ = ["ArgumentTypeError", "show", "check_int", "check_real", "check_bool", "check_choice", "check_str",
           "check_instance", "check_seed", "check_str_sequence", "int_arg", "real_arg", "MAX_SEED", "MAX_NUM_ENVS"]

#: Seeds are ``0 <= seed <= MAX_SEED``: JAX keys hold 32 bits (``PRNGKey(2**32)`` is ``PRNGKey(0)``).
MAX_SEED = 2**32 - 1
#: The most envs of one batch: env indices are int32 on the device.
MAX_NUM_ENVS = 2**31 - 1


class ArgumentTypeError(TypeError, ValueError):
    """An argument of the wrong type (catchable as ``TypeError`` or ``ValueError``)."""


def show(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (a message stays one readable line)."""
    try:
        r = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real error
        r = f"<{type(value).__name__}>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _is_real(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))


def _interval(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return "any finite number"


def check_int(name: str, value: Any, *, minimum: int | None = None, maximum: int | None = None,
              none_ok: bool = False, hint: str = "") -> int | None:
    """``value`` as an ``int`` (``None`` passes when ``none_ok``).

    Raises:
        ArgumentTypeError: not an integer (a bool, a float such as 2.5 or 2.0, a string...).
        ValueError: below ``minimum`` or above ``maximum``.
    """
    if value is None and none_ok:
        return None
    bounds = " and ".join(b for b in (f">= {minimum}" if minimum is not None else "",
                                      f"<= {maximum}" if maximum is not None else "") if b)
    what = f"an integer{' ' + bounds if bounds else ''}{' or None' if none_ok else ''}"
    if not _is_int(value):
        raise ArgumentTypeError(f"{name}={show(value)} must be {what}, got {type(value).__name__}{hint}")
    v = int(value)
    if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
        raise ValueError(f"{name}={show(value)} must be {what}{hint}")
    return v


def check_real(name: str, value: Any, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, none_ok: bool = False, hint: str = "") -> float | None:
    """``value`` as a finite ``float`` in the interval (``None`` passes when ``none_ok``).

    Raises:
        ArgumentTypeError: not a number (a bool, a string...).
        ValueError: NaN, infinite, or outside the interval.
    """
    if value is None and none_ok:
        return None
    rng = _interval(low, high, low_open, high_open)
    if not _is_real(value):
        raise ArgumentTypeError(f"{name}={show(value)} must be a number in {rng}"
                                f"{' or None' if none_ok else ''}, got {type(value).__name__}{hint}")
    v = float(value)
    ok = math.isfinite(v)
    if ok and low is not None:
        ok = v > low if low_open else v >= low
    if ok and high is not None:
        ok = v < high if high_open else v <= high
    if not ok:
        if low is None and high is None:
            raise ValueError(f"{name}={show(value)} must be a finite number{hint}")
        raise ValueError(f"{name}={show(value)} is outside the allowed range {rng}{hint}")
    return v


def check_bool(name: str, value: Any, *, none_ok: bool = False) -> bool | None:
    """``value`` as a ``bool``: only ``True``/``False`` (numpy's too), never ``"no"`` or ``1``."""
    if value is None and none_ok:
        return None
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{name}={show(value)} must be True or False{' or None' if none_ok else ''}, "
                                f"got {type(value).__name__}")
    return bool(value)


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> Any:
    """``value`` if it is one of ``choices`` (compared by equality; unhashable values are fine)."""
    choices = tuple(choices)
    if not any(_same(value, c) for c in choices):
        raise ValueError(f"{name}={show(value)} is not one of {choices}")
    return value


def _same(value: Any, choice: Any) -> bool:
    if choice is None:
        return value is None
    try:  # an array or an object whose __eq__ raises is simply not the choice
        return isinstance(value, type(choice)) and bool(value == choice)
    except Exception:  # noqa: BLE001
        return False


def check_str(name: str, value: Any, *, non_empty: bool = True, none_ok: bool = False) -> str | None:
    """``value`` if it is a string (non-blank when ``non_empty``; no NUL character)."""
    if value is None and none_ok:
        return None
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{name}={show(value)} must be a string{' or None' if none_ok else ''}, "
                                f"got {type(value).__name__}")
    if non_empty and not value.strip():
        raise ValueError(f"{name}={show(value)} must be a non-empty string")
    if "\x00" in value:
        raise ValueError(f"{name}={show(value)} holds a NUL character")
    return value


def check_instance(name: str, value: Any, types: type | tuple[type, ...], *, none_ok: bool = False,
                   what: str | None = None) -> Any:
    """``value`` if it is an instance of ``types`` (or ``None`` when ``none_ok``)."""
    if value is None and none_ok:
        return None
    if not isinstance(value, types):
        names = what or " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
        raise ArgumentTypeError(f"{name}={show(value)} must be {names}{' or None' if none_ok else ''}, "
                                f"got {type(value).__name__}")
    return value


def check_seed(name: str, value: Any, *, none_ok: bool = True) -> int | None:
    """A seed: an integer in ``[0, MAX_SEED]`` (or ``None``; larger ones collide in JAX's 32-bit keys)."""
    return check_int(name, value, minimum=0, maximum=MAX_SEED, none_ok=none_ok)


def check_str_sequence(name: str, value: Any, *, paths: bool = False) -> tuple[str, ...]:
    """``value`` as a tuple of non-blank strings (``paths``: also ``os.PathLike``, returned as ``str``).

    Raises:
        ArgumentTypeError: one string (``sets="original"`` would mean ``"o"``, ``"r"``...: wrap it in a
            list), bytes, a mapping, a non-iterable, or an item of the wrong type.
        ValueError: a blank item.
    """
    kind = "paths" if paths else "strings"
    if isinstance(value, (str, bytes, os.PathLike)):
        raise ArgumentTypeError(f"{name}={show(value)} must be a list of {kind}, got one {type(value).__name__}; "
                                f"write [{show(value)}] for a single one")
    if isinstance(value, dict) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{name}={show(value)} must be a list of {kind}, got {type(value).__name__}")
    out = []
    for i, item in enumerate(value):
        if paths and isinstance(item, os.PathLike):
            item = os.fspath(item)
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{name}[{i}]={show(item)} must be a {'path' if paths else 'string'}, "
                                    f"got {type(item).__name__}")
        out.append(check_str(f"{name}[{i}]", item))
    return tuple(out)


def _arg_type(convert: Callable[[str], Any], what: str, check: Callable[[Any], Any],
              type_name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        try:
            return check(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e).replace("value=", "", 1)) from None
    parse.__name__ = type_name  # argparse names the type in "invalid integer value"
    return parse


def int_arg(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An ``argparse`` ``type=``: the string as an integer within the bounds, else a clear usage error."""
    return _arg_type(lambda t: int(t, 10), "an integer",
                     lambda v: check_int("value", v, minimum=minimum, maximum=maximum), "integer")


def real_arg(low: float | None = None, high: float | None = None, *, low_open: bool = False,
             high_open: bool = False) -> Callable[[str], float]:
    """An ``argparse`` ``type=``: the string as a finite number in the interval, else a clear usage error."""
    return _arg_type(float, "a number",
                     lambda v: check_real("value", v, low=low, high=high, low_open=low_open, high_open=high_open),
                     "number")


def read_json_file(path: str | os.PathLike, what: str, schema: str, object_pairs_hook: Any = None) -> Any:
    """The JSON value in file ``path`` (a ``what``, e.g. "instruction file"); ValueError naming the file when it
    cannot be read, is not JSON, or nests too deeply (``schema``: where its schema is described)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read the {what} ({e})") from None
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    except RecursionError:  # Python's JSON reader recurses once per nesting level
        raise ValueError(f"{path}: nested too deeply to be a {what} (objects and lists inside each other a thousand "
                         f"levels or more); see {schema} for the schema") from None


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename inside it) to disk; a no-op where the platform cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # platforms without directory fds
        return
    with contextlib.suppress(OSError):
        os.fsync(fd)
    os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "w", *, private: bool = True) -> Iterator[IO]:
    """A temporary file beside ``path`` (made with its folders) that replaces ``path`` when the block ends without
    an error, so that a reader never sees a part; on an error it is removed. The file is synced before the rename
    and the folder after it. ``private``: mode 0600, else 0666 less the umask (as ``open`` makes files)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):  # a new, exclusively created temporary name
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        with contextlib.suppress(FileExistsError):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                         0o600 if private else 0o666)
            break
    else:
        raise FileExistsError(f"no free temporary name beside {path}")
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
