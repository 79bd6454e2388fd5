"""tokensvc: an OAuth 2.0 authorization and token service."""

__version__ = "0.1.0"
