"""Settings: a TOML file, then ``TOKENSVC_<SECTION>_<KEY>`` environment overrides, then the
command line's flags.

Loading goes in stages, each with one job and a module of its own:

1. **raw**: the file, the environment and the flags folded into one dict (:func:`load`;
   :mod:`.reading`);
2. **typed**: every key checked against its section's dataclass (:func:`.reading.typed`): an
   unknown key, a wrong type, a missing required value;
3. **resolved**: the defaults that depend on other settings filled in
   (:func:`.resolving.resolve`): the public URLs from the listen address, the refresh grace
   from the storage backend, a demo cookie secret, a logo given as a path;
4. **checked**: the frozen settings built (:mod:`.settings`) and each section's rules checked
   (:func:`.checks.check`), every rule of an identifier taken from :mod:`tokensvc.identifiers`.

:mod:`.loading` runs them in turn; :mod:`.masking` holds what the settings show of themselves
(``config check``). This package's names are the settings' public interface: the rest of the
service imports them from here.

The settings are immutable all the way down (frozen dataclasses, tuples, a read-only mapping):
whatever holds them (the protocol context, every application of the process) shares them
without a copy, and nothing can change them under another holder.

Every key has a default except ``cookie_secret`` outside demo mode. Every stage runs whatever
the ones before found (a value refused is left out, its default taken); then
:class:`ConfigError` lists every problem found, one line each naming its key, and the service
does not start. The settings import nothing of the protocol layer (``tokensvc.oauth``), which
stands below them.
"""

from tokensvc.config.checks import verify_only, warnings
from tokensvc.config.loading import from_dict, load
from tokensvc.config.masking import masked, masked_uri, mongodb_hosts
from tokensvc.config.reading import entry_problems
from tokensvc.config.resolving import listen_url, mongodb_grace_seconds, wildcard_of
from tokensvc.config.settings import (
    COMMAND_LINE_VARIABLES,
    ENV_PREFIX,
    MAX_CONSECUTIVE_FAILED_LOGINS,
    SECRET_KEYS,
    SECRET_VARIABLES,
    SECTIONS,
    STORE_RETRY_AFTER_SECONDS,
    TABLES,
    UNIX_PEER,
    AdminSettings,
    ClientSeed,
    ConfigError,
    FeedSettings,
    InstallationSeed,
    LimitSettings,
    MetricsSettings,
    ProxySettings,
    ServerSettings,
    Settings,
    StorageSettings,
    TokenSettings,
    UserSeed,
)

__all__ = [
    "COMMAND_LINE_VARIABLES", "ENV_PREFIX", "MAX_CONSECUTIVE_FAILED_LOGINS", "SECRET_KEYS", "SECRET_VARIABLES",
    "SECTIONS", "STORE_RETRY_AFTER_SECONDS", "TABLES", "UNIX_PEER", "AdminSettings", "ClientSeed", "ConfigError",
    "FeedSettings", "InstallationSeed", "LimitSettings", "MetricsSettings", "ProxySettings", "ServerSettings",
    "Settings", "StorageSettings", "TokenSettings", "UserSeed", "entry_problems", "from_dict", "listen_url", "load",
    "masked", "masked_uri", "mongodb_grace_seconds", "mongodb_hosts", "verify_only", "warnings", "wildcard_of",
]
