"""The command line: ``tokensvc`` and its subcommands (:mod:`.main`), the operator's commands,
the storage commands, and the supervisor of ``--processes``."""
