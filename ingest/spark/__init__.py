"""The Spark side of a role: its one session (local, standalone or Spark Connect), the
Connect session's owner, the pinned jars, and the interrupts of tagged jobs."""
