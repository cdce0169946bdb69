"""The one base class for mistakes a user can fix.

Every command's `main` is wrapped by `runtime.cli.entry_point`, which ends a `UserError` with the one line
`error: <message>` and no traceback; any other exception (a bug) keeps its traceback.  Each part subclasses it to say where the problem was found.
"""
from __future__ import annotations


class UserError(Exception):
    """Bad input, a missing file or an impossible setting: the message names the problem and the fix."""
