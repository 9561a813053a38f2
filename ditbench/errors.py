"""The one exception type that reaches the user as a message rather than a traceback."""


class UserError(Exception):
    """Bad input from the user: a file, key or value, and what would be valid.

    The CLI prints the message as one paragraph and exits with status 2.
    Raise it with the whole explanation; never wrap a traceback in it.
    """

    exit_code = 2


class UnsupportedError(UserError):
    """A setting that cannot run on this machine (fp16 on CPU, 4 GPUs when 1 is visible).

    The runner records such a cell as `unsupported` with this message as the reason.
    """
