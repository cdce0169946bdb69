"""The error every pruning step raises for settings or checkpoints it cannot work with; it names the fix."""
from runtime.errors import UserError


class PruneError(UserError, ValueError):
    """Settings or a checkpoint that pruning cannot work with."""
