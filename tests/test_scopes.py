"""The scope rule: write ⊇ read ⊇ <resource>:read, write ⊇ <resource>:<action>."""

import pytest

from tokensvc.oauth import scopes


@pytest.mark.parametrize("held,needed,ok", [
    (["read"], "read", True),
    (["write"], "read", True),
    (["write"], "write", True),
    (["read"], "write", False),
    (["write"], "observations:write", True),
    (["write"], "observations:read", True),
    (["write"], "connected-apps:write", True),
    (["read"], "observations:read", True),
    (["read"], "observations:write", False),
    (["observations:write"], "observations:write", True),
    (["observations:write"], "observations:read", False),
    (["observations:write"], "read", False),
    (["observations:read"], "read", False),
    (["admin"], "read", False),
    (["write"], "admin", False),
    (["read", "write"], "admin", False),
    (["admin"], "admin", True),
    ([], "read", False),
])
def test_satisfies(held, needed, ok):
    assert scopes.satisfies(held, needed) is ok


def test_parse_splits_and_deduplicates_in_order():
    assert scopes.parse("write  read write") == ["write", "read"]


@pytest.mark.parametrize("value", [None, "", "   "])
def test_parse_empty_is_none(value):
    assert scopes.parse(value) is None


@pytest.mark.parametrize("value", ['read "quoted"', "back\\slash", "tab\there"])
def test_parse_rejects_characters_outside_rfc6749(value):
    with pytest.raises(ValueError):
        scopes.parse(value)
