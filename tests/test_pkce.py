"""PKCE (RFC 7636), S256 only."""

import pytest
from helpers import CHALLENGE, VERIFIER

from tokensvc.oauth import pkce


def test_rfc7636_appendix_b_vector():
    assert pkce.s256(VERIFIER) == CHALLENGE


def test_verify_accepts_the_matching_verifier():
    assert pkce.verify(VERIFIER, CHALLENGE, "S256")


@pytest.mark.parametrize("verifier", [
    VERIFIER[:-1] + "Y",          # another verifier
    "short",                      # under 43 characters
    "a" * 129,                    # over 128 characters
    VERIFIER[:-1] + "!",          # outside the unreserved set
    "",
])
def test_verify_rejects_wrong_or_malformed_verifiers(verifier):
    assert not pkce.verify(verifier, CHALLENGE, "S256")


def test_plain_method_is_not_supported():
    assert not pkce.verify(CHALLENGE, CHALLENGE, "plain")


@pytest.mark.parametrize("challenge,valid", [
    (CHALLENGE, True), (CHALLENGE + "=", False), (CHALLENGE[:-1], False), ("x" * 43, True), ("+" * 43, False)])
def test_challenge_shape(challenge, valid):
    assert pkce.is_valid_challenge(challenge) is valid
