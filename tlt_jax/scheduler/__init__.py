"""Host-side scheduling of drafter training into idle device slices."""

from tlt_jax.scheduler.slices import SchedulerConfig, SliceScheduler

__all__ = ["SchedulerConfig", "SliceScheduler"]
