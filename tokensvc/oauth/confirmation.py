"""The confirmation code of an authorization that would grant ``admin`` to a native app.

A public client whose redirect is a loopback address or a private-use scheme cannot prove it
is the app it names: any local program may listen on the port, any app may claim the scheme,
and the request itself (its PKCE challenge, its port, its state) is written by whoever starts
it. A page elsewhere that lures a signed-in administrator into two clicks (the first opens the
one-click page, the second lands on Continue) would have its own program receive the code and
exchange it. So such an authorization is completed only by the program that saw the person
decide: the page shows a confirmation code that the service alone knows (:func:`new`), the
person types it into the program that started the flow (``tokensvc login`` asks on the
terminal), and the exchange carries it (the ``confirmation_code`` parameter). A code delivered
to a program that never saw the page is worth nothing.

What the store holds makes the rule hold for every release: the code is stored under the
digest of the code *and* its confirmation (:func:`code_digest`), never under the code's own
digest, so a process that looks the code up by the code alone (release 0.10.0, or a
presentation without the confirmation) finds nothing and answers ``invalid_grant``.

Guessing is bounded per code. A code may be presented with a confirmation at most
:data:`PRESENTATIONS` times over its life, whoever presents it and from wherever (counted in
the store before the lookup, so concurrent guesses count too); past that it is dead, the right
confirmation included. A confirmation is :data:`LENGTH` characters of a 32-letter alphabet
(40 bits), so the holder of a code guesses right with a chance of 3 in 2^40, about 1 in 366
billion, and each new code needs the person's clicks again.
"""

from __future__ import annotations

import hashlib
import secrets

from tokensvc.oauth import hashing

PARAMETER = "confirmation_code"
# Crockford's base32: digits and capitals without I, L, O and U, which a person misreads (I, L,
# O are read as 1, 1, 0 when typed) or which spell words by accident (U).
ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
LENGTH = 8  # 40 bits
PRESENTATIONS = 3  # presentations of one code with a confirmation; past them the code is dead
# The token endpoint's description of a confirmation that is not the page's (``tokensvc login``
# asks for it again when it reads this), or of a code it finds nothing for.
NOT_THE_PAGES = "Unknown authorization code, or not the confirmation code its page showed"
_READ_AS = str.maketrans({"O": "0", "I": "1", "L": "1"})


def new() -> str:
    """A confirmation code: :data:`LENGTH` characters of :data:`ALPHABET`, from :mod:`secrets`."""
    return "".join(secrets.choice(ALPHABET) for _ in range(LENGTH))


def shown(confirmation: str) -> str:
    """How a page writes ``confirmation``: two groups of four (``K7QM-3XPD``)."""
    half = LENGTH // 2
    return f"{confirmation[:half]}-{confirmation[half:]}"


def normalized(typed: str | None) -> str | None:
    """A confirmation as the person typed it, in the form it was issued in: capitals, without
    spaces or hyphens, O read as 0 and I and L as 1. None when it cannot be one (the wrong
    length, a character outside the alphabet)."""
    if typed is None or len(typed) > 4 * LENGTH:
        return None
    text = "".join(typed.split()).replace("-", "").upper().translate(_READ_AS)
    if len(text) != LENGTH or any(character not in ALPHABET for character in text):
        return None
    return text


def code_digest(code: str, confirmation: str) -> str:
    """The digest a code issued with ``confirmation`` is stored and looked up under: of both,
    so that the code alone finds nothing."""
    return hashing.digest(f"{code}\x00{confirmation}")


def presentations_key(code: str) -> str:
    """What the presentations of ``code`` with a confirmation are counted under: a digest of its
    own, equal to no key the store looks anything up by."""
    return hashlib.sha256(f"confirmation presentations\x00{code}".encode("utf-8", "surrogatepass")).hexdigest()[:32]
