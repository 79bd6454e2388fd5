"""schemathesis over the admin listener's OpenAPI document, as an admin, against the real service:
tests/test_fuzz.py says what the run checks and how, and runs the public document's."""

from __future__ import annotations

import pytest
import test_fuzz
from test_fuzz import EXAMPLES, schemathesis

pytestmark = pytest.mark.e2e

# The service and its callers' credentials as test_fuzz.py makes them, one service for this file.
service, credentials = test_fuzz.service, test_fuzz.credentials


def test_the_admin_api_is_as_its_document_says(service, credentials, tmp_path):
    output, generated = schemathesis(service.admin + "/openapi.json", credentials, tmp_path,
                                     {"TOKENSVC_FUZZ_AS": "admin", "TOKENSVC_FUZZ_ADMIN": service.admin})
    assert generated >= 20 * EXAMPLES and "Operations:       27 selected / 27 total" in output, output
