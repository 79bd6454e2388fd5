"""tokensvc: an OAuth 2.0 authorization and token service.

``__version__`` is the release (semantic versioning; CHANGELOG.md has each release, UPGRADE.md
its upgrade notes); between releases, the next one's as a development version (``0.11.0.dev0``).
The package's metadata takes it from here (setup.cfg), ``tokensvc --version`` prints it,
``/healthz`` answers it, and every process names it to MongoDB (its ``appName`` and its entry
among the running processes, ``tokensvc/storage/mongo/processes.py``).
"""

__version__ = "0.11.0.dev0"
