"""The web edge: thin Tornado handlers that parse with a schema, call the protocol layer and
answer. The endpoints are this package's modules, one per family of routes; the machinery
every route goes through (the way in, the way out, the adapters, the guards) is :mod:`.edge`."""
