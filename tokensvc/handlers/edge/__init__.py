"""The machinery every route goes through: the request lifecycle (the way in), the exit (the
way out, and the ``Edge`` every route shares), the two adapters and the page base, and the
guards, headers, limits and logs that every request meets. It imports no endpoint."""
