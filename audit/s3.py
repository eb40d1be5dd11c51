"""The S3 checkpoint store's backend, a module of its own: boto3 is imported only by a process
whose settings name a bucket (audit/stores.py)."""
from datetime import timedelta

from storages.backends.s3 import S3Storage

from orchestrator.engine.clock import now


class LockedS3Storage(S3Storage):
    """S3Storage whose uploads carry an object-lock retention of `retain_days` (COMPLIANCE
    mode unless `lock_mode` says GOVERNANCE), on top of whatever default retention the bucket
    has. The bucket must have been created with object lock enabled."""

    def __init__(self, *, retain_days: int = 0, lock_mode: str = "COMPLIANCE", **options):
        self.retain_days, self.lock_mode = retain_days, lock_mode
        super().__init__(**options)

    def get_object_parameters(self, name):
        parameters = super().get_object_parameters(name)
        if self.retain_days:
            parameters.update(ObjectLockMode=self.lock_mode,
                              ObjectLockRetainUntilDate=now() + timedelta(days=self.retain_days))
        return parameters
