"""The error every part of parallel/ raises for a layout that cannot work; it names the fix."""
from runtime.errors import UserError


class ParallelError(UserError):
    """A parallel layout that cannot work with this model, batch or launch; the message names the fix."""
