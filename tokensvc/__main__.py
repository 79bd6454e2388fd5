"""``python -m tokensvc`` runs the same command line as the ``tokensvc`` script."""

from tokensvc.cli.main import main

raise SystemExit(main())
