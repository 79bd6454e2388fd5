"""A MongoDB URI read by PyMongo's own parser, for the configuration's check: every option it
refuses, one line each, and nothing resolved or connected."""

from __future__ import annotations

import functools
import re
import warnings as python_warnings
from collections.abc import Callable
from typing import Any

from pymongo import uri_parser
from pymongo.errors import PyMongoError


def uri_problems(uri: str) -> list[str]:
    """What PyMongo's own parser refuses in ``uri``, one line each: an option it does not know
    (``tsl=true``, named by its place in the query, since PyMongo never names an unknown key:
    it may be credential text), a value it does not take (``tls=maybe``), then the URI as a
    whole (hosts, ports, options in conflict or given twice). Nothing is resolved: a
    ``mongodb+srv`` name is not looked up. PyMongo's warnings are caught and said here too,
    never written to standard error."""
    problems: list[str] = []
    scheme, _, scheme_free = uri.partition("://")
    userinfo, at, after = scheme_free.rpartition("@")
    if at:  # read with its user and password masked: no message of the parser can repeat them
        try:
            unescaped = userinfo != scheme_free.partition("?")[0].partition("/")[0].rpartition("@")[0]
            uri_parser.parse_userinfo("@" if unescaped else userinfo)
        except PyMongoError as exc:  # its fixed text names neither
            problems.append(f"the user and password before the hosts: {exc} (an '@', ':', '/' or '?' in them "
                            "is written %40, %3A, %2F, %3F)")
        scheme_free = f"{'***:***' if ':' in userinfo else '***'}@{after}"
        uri = f"{scheme}://{scheme_free}"
    query = scheme_free.partition("?")[2]

    def said(what: str, parse: Callable[[], Any]) -> bool:
        with python_warnings.catch_warnings(record=True) as caught:
            python_warnings.simplefilter("always")
            try:
                parse()
            except OSError as exc:  # a file an option names (tlsCAFile, tlsCertificateKeyFile) not read
                problems.append(f"{what}{exc.strerror or exc} (check the file the option names, and that this "
                                "user may read it)")
                return False
            except (ValueError, TypeError, PyMongoError) as exc:  # InvalidURI and ConfigurationError among them
                problems.append(f"{what}{_unsaid(str(exc))}")
                return False
        problems.extend(f"{what}{_unsaid(str(warning.message))}" for warning in caught)
        return not caught

    taken = []
    for place, option in enumerate(filter(None, re.split("[&;]", query)), 1):
        name = option.partition("=")[0]
        known = name.lower() in uri_parser.URI_OPTIONS_VALIDATOR_MAP or name.lower() == "readpreferencetags"
        what = f"option {name}: " if known else f"option {place} of the query, not named (it may be credential text): "
        if said(what, functools.partial(uri_parser.split_options, option, validate=True, warn=False)):
            taken.append(option)
    parse: Callable[..., Any] | None
    try:  # parse_uri without its DNS lookups (mongodb+srv), in every PyMongo 4 since 4.13
        from pymongo.uri_parser_shared import _validate_uri as parse
    except ImportError:  # pragma: no cover - a later PyMongo 4: its public parser, mongodb:// alone
        parse = uri_parser.parse_uri if uri.startswith("mongodb://") else None
    if parse is not None:  # the whole URI, with the options refused above left out
        whole = uri.partition("?")[0] + ("?" + "&".join(taken) if taken else "")
        said("", functools.partial(parse, whole, validate=True, warn=False))
    return problems


def _unsaid(message: str) -> str:
    """PyMongo's ``message`` without its advice to read a docstring."""
    return message.replace(" Refer to docstring.", "")
