"""The schemas' compiled fast paths agree with marshmallow itself."""

import pytest
from marshmallow import ValidationError

from tokensvc import schemas
from tokensvc.oauth.grants import TokenResponse

LOAD_CASES = [
    {"token": "abc"},
    {"token": "abc", "token_type_hint": "access_token", "client_id": "webapp", "extra": "ignored"},
    {"token": "x" * 512},
    {"token": "x" * 513},
    {},
    {"token": 5},
    {"token": None},
    {"token": "", "client_secret": "s" * 600},
]


@pytest.mark.parametrize("data", LOAD_CASES)
@pytest.mark.parametrize("schema", [schemas.token_action, schemas.token_request, schemas.refresh_request,
                                    schemas.client_id_path, schemas.login_form])
def test_fast_load_agrees_with_marshmallow(schema, data):
    try:
        expected = schema.load(data)
    except ValidationError as exc:
        with pytest.raises(ValidationError) as info:
            schemas.fast_load(schema, data)
        assert info.value.messages == exc.messages
    else:
        assert schemas.fast_load(schema, data) == expected


@pytest.mark.parametrize("obj,schema", [
    ({"active": False}, schemas.introspection_response),
    ({"active": True, "scope": "read", "client_id": "c", "token_type": "access_token", "exp": 2, "iat": 1,
      "iss": "http://x", "sub": "u", "subject_type": "user", "username": "alice", "junk": 1},
     schemas.introspection_response),
    (TokenResponse("a", "r", 3600, "read write"), schemas.token_response),
    ({"subjectType": "user", "id": "u", "username": "alice", "clientId": None, "scopes": ["read"]}, schemas.me),
])
def test_fast_dump_agrees_with_marshmallow(obj, schema):
    assert schemas.fast_dump(schema, obj) == schema.dump(obj)


def test_a_schema_made_per_call_gets_its_own_fast_path_and_leaves_none_behind():
    """The compiled functions are kept by the schema itself, not by its address: a schema made
    and dropped at every call never finds a dropped one's loader (CPython reuses addresses at
    once), and the cache holds nothing of it afterwards."""
    import gc

    from marshmallow import Schema, fields

    before = len(schemas._loaders), len(schemas._dumpers)
    for index in range(200):
        name = f"field{index}"
        schema = Schema.from_dict({name: fields.String(required=True)})()
        assert schemas.fast_load(schema, {name: "x"}) == {name: "x"}
        with pytest.raises(ValidationError):
            schemas.fast_load(schema, {})
        assert schemas.fast_dump(schema, {name: "y", "other": "z"}) == {name: "y"}
        del schema
    gc.collect()
    assert (len(schemas._loaders), len(schemas._dumpers)) == before
