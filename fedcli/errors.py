"""The one exception type for mistakes a user can fix: the CLI prints it as one line, exit code 2."""


class UserError(Exception):
    """Bad input, options or artifacts. The message says what is wrong and what to do."""
