"""The OpenAPI 3.1 documents of the public listener and of the admin listener (:mod:`.document`)."""
