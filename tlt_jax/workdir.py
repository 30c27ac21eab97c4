"""One job per workdir: an OS lock on a file in the workdir, held for the whole job.

Two jobs writing one workdir interleave their metrics rows and overwrite each other's
checkpoints, and both exit 0. `hold(workdir)` takes an exclusive `fcntl.flock` on
<workdir>/tlt_jax.lock and keeps it until the job ends. The kernel drops the lock with the
process, whatever ends it (kill -9 included), so a killed job's rerun takes it at once and
resumes; a stale lock file is harmless, only the lock on it counts. A second job on a
locked workdir gets `WorkdirBusy`, whose message names the holder (the pid, host and start
time the holder wrote into the file).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import os
import socket
from collections.abc import Iterator

from tlt_jax.configuration import UserError

LOCK_NAME = "tlt_jax.lock"


class WorkdirBusy(UserError):
  """Another live process holds the workdir's lock."""


def _holder_text() -> str:
  start = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
  return f"pid {os.getpid()} on {socket.gethostname()}, started {start}\n"


@contextlib.contextmanager
def hold(workdir: str) -> Iterator[str]:
  """Holds `workdir`'s lock for the `with` block (creating the workdir); yields the lock
  file's path.

  Raises:
    WorkdirBusy: another process holds it (checked without waiting).
  """
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_NAME)
  # O_CLOEXEC (Python's default): programs the job starts do not inherit the lock.
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      with open(path) as f:
        holder = f.read().strip() or "a process that has not written its name yet"
      raise WorkdirBusy(
        f"workdir {workdir} is in use by another job ({holder}; lock file {path}): wait for "
        "it to end, or give this job another --workdir"
      ) from None
    # The file is rewritten only under the lock, so a reader never sees a mix of two
    # holders (a reader that loses the race may see it empty, said as much above).
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder_text().encode(), 0)
    yield path
  finally:
    # Closing the descriptor releases the lock; the file stays (removing it could let a
    # job that opened it just before lock an unlinked file while a third creates another).
    os.close(fd)
