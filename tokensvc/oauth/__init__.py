"""The OAuth 2.0 protocol layer: no web framework and no database driver in here.

It talks to storage only through :class:`tokensvc.storage.base.Store`.
"""
