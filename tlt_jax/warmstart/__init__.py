"""The policy's supervised warm start: next-token training on a task's worked solutions."""
