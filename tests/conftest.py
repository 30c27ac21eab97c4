"""Shared test set-up.

Every new shape compiles (seconds on these CPUs), so fixtures that build
engines are module-scoped and share compiled programs across tests.
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
