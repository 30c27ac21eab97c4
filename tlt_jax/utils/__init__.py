"""Small shared helpers: clipped AdamW optimisers (per parameter group), tree paths and the
persistent compile cache (`compile_cache`), trace-time settings in context variables
(`scoped`), PRNG keys from host integers under the RL loop's transfer guard (`keys`), the
cycle collector's settings for a long JAX process (`collector`)."""

from tlt_jax.utils.optim import FROZEN, clipped_adamw, grouped_clipped_adamw
from tlt_jax.utils.trees import path_name

__all__ = ["FROZEN", "clipped_adamw", "grouped_clipped_adamw", "path_name"]
