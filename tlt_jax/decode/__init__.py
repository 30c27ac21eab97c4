"""Decoding pieces: sampling, drafts (EAGLE chains and trees, group drafts) and their exact
verification against the target's distribution."""

from tlt_jax.decode.drafting import Draft, draft_chain, draft_tree, prefill_drafter_cache
from tlt_jax.decode.group_drafts import GroupCorpus, GroupMatch
from tlt_jax.decode.sampling import SamplingConfig, sample_tokens
from tlt_jax.decode.verify import VerifyResult, verify_chain, verify_greedy, verify_sampling

__all__ = [
  "Draft",
  "GroupCorpus",
  "GroupMatch",
  "SamplingConfig",
  "VerifyResult",
  "draft_chain",
  "draft_tree",
  "prefill_drafter_cache",
  "sample_tokens",
  "verify_chain",
  "verify_greedy",
  "verify_sampling",
]
