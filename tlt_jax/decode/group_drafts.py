"""Drafts from the group's own text: longest-suffix match over sibling rows and earlier rollouts.

In GRPO the G samples of a prompt, and that prompt's rollouts in earlier epochs, repeat long
stretches of each other (scratchpad lines, final answers). A row's draft is read off that text:
find where the row's last tokens occur, and propose what followed there. No model runs, so a
group draft costs a few vectorised comparisons instead of `depth` drafter steps.

The match runs on the device, inside the speculative program's round loop, so every round
drafts from the row's newest token without a host round trip (a host-side suffix tree queried
per round would cost a device->host->device trip per round and forbid the multi-round device
loop). The text a row matches against (its `GroupCorpus`):
  * its live sibling rows in the batch (the row itself included: a row repeats itself too),
    read from the rollout state each round, so siblings' progress is seen at once;
  * a per-prompt reference the host keeps: that prompt's earlier rollouts and the siblings
    that already finished and left the batch (`tlt_jax.rollout.history`).

Suffix structures from libraries, evaluated (2026-11) and not used, for that reason: both
answer on the host, once per query. arctic-inference 0.3.0 (SuffixDecoding's C++ suffix
tree, `SuffixDecodingCache.speculate(request, context)`) is a vLLM plugin published as a
source package whose build imports torch >= 2.10 and compiles nanobind extensions; one
query per row per round would cut every multi-round device call into single rounds.
pydivsufsort 0.0.20 builds a static suffix array of one text (rebuilt on every change; the
sibling rows grow every round). The device-side match needs neither: the corpus is at
most a few thousand tokens per row, so a vectorised comparison over it is a small share of
a round (the SD benchmark's round-cost table), and it reads the siblings' newest tokens.

Rule (that of a suffix tree queried with the row's context, as in SuffixDecoding, Oliaro et
al. 2024): the longest suffix of the row's text (up to `ngram` tokens) that occurs in the
corpus with a known continuation fixes the candidate positions (the `candidates` most recent
occurrences); the draft then follows the continuations token by token, each time taking the
token most of the surviving candidates continue with and dropping the others. Verification
is the target's usual rule, so any draft, good or bad, leaves the output unchanged.

Shape letters: B rows, S token slots, W siblings per row, P prompts, R reference tokens,
L = W * (S + 1) + R corpus positions, M candidates, D depth.
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Int

from tlt_jax.decode.drafting import Draft

NO_TOKEN = -1  # corpus entries that are no text: padding, separators, slots past a row's length


@dataclasses.dataclass(frozen=True)
class GroupMatch:
  """Static settings of the match (part of a compiled program's key).

  Attributes:
    ngram: longest suffix compared (the match length is capped there).
    candidates: occurrences of the longest matched suffix followed (the most recent).
    min_match: hybrid drafts take the group draft where its match is at least this long
      and it agrees with the drafter's first `agree` tokens, the drafter's otherwise.
    agree: leading draft tokens the group draft must share with the drafter's (0: none).
      Where the two disagree at once the drafter is usually right (it tracks the policy;
      the group's text is only another sample), so the group draft is taken where it
      confirms the drafter's start and goes on from a verbatim repetition.
  """

  ngram: int = 8
  candidates: int = 16
  min_match: int = 3
  agree: int = 1

  def __post_init__(self):
    for name, low in (("ngram", 1), ("candidates", 1), ("min_match", 1), ("agree", 0)):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ValueError(f"GroupMatch.{name} must be an int >= {low}, got {v!r}")


DEFAULT_MATCH = GroupMatch()


@flax.struct.dataclass
class GroupCorpus:
  """The text each row's group drafts are matched against (device arrays).

  Attributes:
    siblings: [B, W] int32, rows of the batch sampled from the same prompt as row b (row b
      itself among them); -1 pads.
    reference: [P, R] int32, per prompt: earlier rollouts and finished siblings, separated by
      and padded with NO_TOKEN.
    row_reference: [B] int32, the reference row of each row's prompt; -1 none.
  """

  siblings: jax.Array
  reference: jax.Array
  row_reference: jax.Array


def corpus_text(
  tokens: Int[Array, "B S"], length: Int[Array, " B"], corpus: GroupCorpus
) -> Int[Array, "B L"]:
  """Each row's corpus as one token line: its siblings' text (slots < their length), each
  followed by a NO_TOKEN so no continuation runs from one row into the next, then the
  reference of its prompt."""
  b, s = tokens.shape
  sib = corpus.siblings
  rows = jnp.take(tokens, jnp.maximum(sib, 0), axis=0)  # [B, W, S]
  sib_len = jnp.where(sib >= 0, jnp.take(length, jnp.maximum(sib, 0)), 0)  # [B, W]
  live = jnp.where(jnp.arange(s)[None, None, :] < sib_len[:, :, None], rows, NO_TOKEN)
  live = jnp.pad(live, ((0, 0), (0, 0), (0, 1)), constant_values=NO_TOKEN).reshape(b, -1)
  ref = jnp.take(corpus.reference, jnp.maximum(corpus.row_reference, 0), axis=0)  # [B, R]
  ref = jnp.where(corpus.row_reference[:, None] >= 0, ref, NO_TOKEN)
  return jnp.concatenate([live, ref.astype(live.dtype)], axis=1)


def suffix_match_lengths(
  text: Int[Array, "B L"], tokens: Int[Array, "B S"], length: Int[Array, " B"], ngram: int
) -> Int[Array, "B L"]:
  """m[b, j]: how many of row b's last tokens (up to `ngram`) end at text position j, i.e.
  the largest k with text[b, j - i] == tokens[b, length[b] - 1 - i] for every i < k."""
  s = tokens.shape[1]
  pos = length[:, None] - 1 - jnp.arange(ngram)  # [B, ngram]: newest first
  query = jnp.take_along_axis(tokens, jnp.clip(pos, 0, s - 1), axis=1)
  query = jnp.where(pos >= 0, query, NO_TOKEN - 1)  # before the text's start: matches nothing
  run = jnp.ones(text.shape, bool)
  m = jnp.zeros(text.shape, jnp.int32)
  for i in range(ngram):
    shifted = jnp.pad(text, ((0, 0), (i, 0)), constant_values=NO_TOKEN)[:, : text.shape[1]]
    run = run & (shifted == query[:, i : i + 1]) & (shifted != NO_TOKEN)
    m = m + run
  return m


def group_chain(
  tokens: Int[Array, "B S"],
  length: Int[Array, " B"],
  corpus: GroupCorpus,
  *,
  depth: int,
  match: GroupMatch = DEFAULT_MATCH,
) -> tuple[Draft, Int[Array, " B"]]:
  """A chain draft per row from its corpus (module docstring), and its match length.

  Node 0 is the root (the row's last token). Nodes past the end of every surviving
  continuation are marked invalid (verification never accepts them); a row without any match
  (match length 0) drafts nothing valid.
  """
  text = corpus_text(tokens, length, corpus)
  size = text.shape[1]
  m = suffix_match_lengths(text, tokens, length, match.ngram)
  nxt = jnp.pad(text[:, 1:], ((0, 0), (0, 1)), constant_values=NO_TOKEN)
  usable = (m > 0) & (nxt != NO_TOKEN)  # a continuation is known
  # Longest match first, then the most recent position: one int32 score (size * ngram fits).
  score = jnp.where(usable, m * size + jnp.arange(size)[None, :], -1)
  k = min(match.candidates, size)
  top, idx = jax.lax.top_k(score, k)  # [B, M]
  best = jnp.where(top[:, 0] >= 0, top[:, 0] // size, 0)  # the longest match length
  alive = (top >= 0) & (top // size == best[:, None])
  cpos = idx[:, :, None] + 1 + jnp.arange(depth)  # [B, M, D]
  cont = jnp.take_along_axis(text, jnp.clip(cpos, 0, size - 1).reshape(len(text), -1), axis=1)
  cont = cont.reshape(cpos.shape)
  known = jnp.cumprod((cpos < size) & (cont != NO_TOKEN), axis=2).astype(bool)
  drafted, valid = [], []
  for d in range(depth):
    tok, ok = cont[:, :, d], alive & known[:, :, d]
    # Votes: candidates still alive that continue with the same token.
    votes = jnp.sum((tok[:, :, None] == tok[:, None, :]) & ok[:, None, :], axis=2)
    pick = jnp.argmax(jnp.where(ok, votes, -1), axis=1)  # ties: the best-scored candidate
    chosen = jnp.take_along_axis(tok, pick[:, None], axis=1)[:, 0]
    any_ok = ok.any(axis=1)
    alive = ok & (tok == chosen[:, None])
    drafted.append(jnp.where(any_ok, chosen, 0))
    valid.append(any_ok)
  b = tokens.shape[0]
  root = jnp.take_along_axis(tokens, jnp.maximum(length - 1, 0)[:, None], axis=1)
  n = depth + 1
  draft = Draft(
    tokens=jnp.concatenate([root, jnp.stack(drafted, axis=1)], axis=1).astype(jnp.int32),
    parents=jnp.broadcast_to(jnp.arange(-1, depth, dtype=jnp.int32), (b, n)),
    valid=jnp.concatenate([jnp.ones((b, 1), bool), jnp.stack(valid, axis=1)], axis=1),
    depth=jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)),
    probs=jnp.ones((b, n), jnp.float32),
    scores=jnp.ones((b, n), jnp.float32),
  )
  return draft, best.astype(jnp.int32)


def hybrid_choice(
  match_len: Int[Array, " B"], group: Draft, drafter: Draft, match: GroupMatch
) -> jax.Array:
  """[B] bool: rows whose hybrid draft is the group chain (`GroupMatch.min_match` and
  `GroupMatch.agree`); both drafts are chains of one depth."""
  use = (match_len >= match.min_match) & group.valid[:, 1]
  lead = slice(1, 1 + min(match.agree, group.tokens.shape[1] - 1))  # nodes after the root
  same = (group.tokens[:, lead] == drafter.tokens[:, lead]) & drafter.valid[:, lead]
  return use & (same & group.valid[:, lead]).all(axis=1)  # all() of none (agree 0): True


def choose_drafts(use_first: jax.Array, first: Draft, second: Draft) -> Draft:
  """Per row, `first` where use_first[b], else `second` (same shapes)."""
  pick = lambda a, c: jnp.where(use_first.reshape((-1,) + (1,) * (a.ndim - 1)), a, c)
  return jax.tree.map(pick, first, second)
