"""The error every door to flashcheck (the CLI, the Python API, the pytest plugin) reports as a usage error: a
request that cannot run as given. The CLI exits with status 2 on it."""


class UsageError(Exception):
    """A request that cannot run as given (exit status 2)."""
