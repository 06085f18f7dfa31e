"""A pipe that any thread writes a byte to, to wake a dispatcher blocked in multiprocessing.connection.wait()
(which waits on file descriptors and connections, not on conditions)."""

from __future__ import annotations

import os
import weakref


class WakePipe:
    def __init__(self):
        self.r, self.w = os.pipe()  # wait() on r; wake() writes to w
        os.set_blocking(self.r, False)
        # closed when this object goes (not before: other threads may wake it), not at exit, while a dispatcher
        # may still read it
        weakref.finalize(self, _close_fds, self.r, self.w).atexit = False

    def wake(self) -> None:
        try:
            os.write(self.w, b"x")
        except OSError:  # closed: nobody waits any more
            pass

    def drain(self) -> None:
        """Read every byte written so far (the dispatcher, after wait() returned r)."""
        try:
            while os.read(self.r, 4096):
                pass
        except BlockingIOError:
            pass


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
