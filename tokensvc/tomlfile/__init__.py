"""A TOML file read whole, or refused in one line that names it: the service's configuration and
``apply -f`` (:mod:`tokensvc.config`) and the gate's file (:mod:`tokensvc.gate`) are read here.

A device, a pipe or a socket is refused before it is read: ``/dev/zero`` would be read without
end, and a pipe would wait for a writer. A UTF-8 byte order mark is named, as TOML does not take
one. Nothing here imports the rest of tokensvc, so both the configuration and the gate, which
stands below it, import it."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any


class FileRefused(ValueError):
    """Why a file was not read, in one line that names it."""


def read(path: str | os.PathLike[str], *, what: str = "config file", option: str = "--config") -> dict[str, Any]:
    """The TOML document at ``path``; what keeps it from being read, in one line (``what`` the
    file is, given with ``option``)."""
    try:
        if os.path.exists(path) and not os.path.isdir(path) and not stat.S_ISREG(os.stat(path).st_mode):
            raise FileRefused(f"{path}: not a regular file (give the TOML file with {option})")
        text = Path(path).read_text(encoding="utf-8")
        if text.startswith("\ufeff"):
            raise FileRefused(f"{path}: starts with a UTF-8 byte order mark, which TOML does not take: save it as "
                              "UTF-8 without one")
        return tomllib.loads(text)
    except FileNotFoundError:
        raise FileRefused(f"{what} not found: {path}") from None
    except IsADirectoryError:
        raise FileRefused(f"{path}: a directory, not a {what} (give the TOML file with {option})") from None
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{path}: not UTF-8 text (byte {exc.start}): a {what} is TOML in UTF-8") from None
    except OSError as exc:  # no permission to read it, an I/O error
        raise FileRefused(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise FileRefused(f"{path}: not valid TOML: {exc}") from None
