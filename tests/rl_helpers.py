"""Shared pieces of the tests that run the GRPO trainer on token-id "text"."""

from tlt_jax.rl.trainer import GRPOConfig


class IdTokenizer:
  """Token ids written as space-separated numbers; id 0 is EOS."""

  eos_id = 0

  def encode(self, text, add_bos=False):
    return [int(t) for t in text.split()]

  def decode(self, ids):
    return " ".join(str(int(i)) for i in ids)


def seven_reward(text, answer):
  """A controlled reward: 1 when the completion contains the token 7."""
  return float("7" in text.split())


def tiny_grpo(steps, group_size, checkpoint_every=1):
  """Two prompts per step, no evaluation or dynamic sampling, one reward worker."""
  return GRPOConfig(
    steps=steps,
    prompts_per_step=2,
    group_size=group_size,
    eval_every=0,
    eval_examples=2,
    checkpoint_every=checkpoint_every,
    dynamic_sampling=False,
    reward_workers=1,
  )
