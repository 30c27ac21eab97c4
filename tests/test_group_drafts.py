"""Group drafts: the suffix match on hand-written token streams, the reference lines and the
per-prompt history (its checkpoint round trip included)."""

import jax.numpy as jnp
import numpy as np
import pytest

from tlt_jax.decode.drafting import Draft
from tlt_jax.decode.group_drafts import (
  NO_TOKEN,
  GroupCorpus,
  GroupMatch,
  choose_drafts,
  corpus_text,
  group_chain,
  hybrid_choice,
  suffix_match_lengths,
)
from tlt_jax.decode.sampling import SamplingConfig
from tlt_jax.decode.verify import verify_chain
from tlt_jax.rollout.history import PromptHistory, reference_line
from tlt_jax.rollout.speculative import SpecStrategy

S = 12


def _batch(rows):
  """[B, S] tokens (zero-padded past each row's length, as stale buffer contents) + lengths."""
  tokens = np.zeros((len(rows), S), np.int32)
  for i, r in enumerate(rows):
    tokens[i, : len(r)] = r
  return jnp.asarray(tokens), jnp.asarray([len(r) for r in rows], jnp.int32)


def _corpus(siblings, reference=None, width=4, ref_len=8):
  sib = np.full((len(siblings), width), -1, np.int32)
  for i, s in enumerate(siblings):
    sib[i, : len(s)] = s
  ref = np.full((len(siblings), ref_len), NO_TOKEN, np.int32)
  rows = np.full((len(siblings),), -1, np.int32)
  for i, r in enumerate(reference or []):
    if r is not None:
      ref[i, ref_len - len(r) :] = r
      rows[i] = i
  return GroupCorpus(jnp.asarray(sib), jnp.asarray(ref), jnp.asarray(rows))


def _draft(rows, siblings, reference=None, depth=3, **match):
  """Drafts of every row; rows past those `siblings` / `reference` list read themselves only."""
  siblings = list(siblings) + [[i] for i in range(len(siblings), len(rows))]
  reference = list(reference or []) + [None] * (len(rows) - len(reference or []))
  tokens, length = _batch(rows)
  draft, m = group_chain(
    tokens, length, _corpus(siblings, reference), depth=depth, match=GroupMatch(**match)
  )
  toks, valid = np.asarray(draft.tokens), np.asarray(draft.valid)
  # Every draft is a chain rooted at the row's last token.
  np.testing.assert_array_equal(toks[:, 0], [r[-1] for r in rows])
  np.testing.assert_array_equal(np.asarray(draft.parents)[0], np.arange(-1, depth))
  return [list(t[1:][v[1:]]) for t, v in zip(toks, valid)], list(np.asarray(m))


def test_a_row_repeats_itself():
  """Own text: "2 3" occurred before, so the draft is what followed it then; the row's own
  end (the query itself) has no continuation and is never a candidate."""
  drafts, m = _draft([[1, 2, 3, 4, 5, 6, 2, 3]], [[0]])
  assert drafts == [[4, 5, 6]] and m == [2]


def test_longest_match_wins_over_frequency():
  rows = [[3, 7, 8], [3, 7, 8, 4, 0], [1, 7, 8, 9], [2, 7, 8, 9]]
  drafts, m = _draft(rows, [[0, 1, 2, 3]], depth=2)
  assert m[0] == 3 and drafts[0] == [4, 0]


def test_continuations_follow_the_majority_then_the_most_recent():
  """Among the occurrences of the longest suffix, each draft token is the one most of the
  surviving occurrences continue with; ties go to the latest position in the corpus."""
  rows = [[6, 7, 8], [7, 8, 9, 1], [7, 8, 9, 2], [7, 8, 5, 5]]
  drafts, m = _draft(rows, [[0, 1, 2, 3]], depth=3)
  assert m[0] == 2
  # 9 (two votes) over 5; then 1 vs 2 tie -> row 2 (later); row 2 ends there.
  assert drafts[0] == [9, 2]


def test_no_continuation_across_rows_or_past_a_length():
  """A sibling whose text ends right after the match offers nothing (no running into the next
  row, nor into the stale buffer past its length); without any match nothing is drafted."""
  rows = [[5, 7, 8], [1, 7, 8], [9, 9]]
  drafts, m = _draft(rows, [[0, 1, 2]])
  assert drafts[0] == [] and m[0] == 0
  drafts, m = _draft([[1, 2, 3]], [[0]])
  assert drafts == [[]] and m == [0]


def test_reference_of_earlier_rollouts():
  """A row alone in the batch drafts from its prompt's reference line; padding siblings
  (-1) and rows without a reference (-1) read nothing."""
  rows = [[4, 7, 8], [4, 7, 8]]
  drafts, m = _draft(rows, [[0], []], reference=[[7, 8, 6, 6, NO_TOKEN, 7, 8], None])
  assert drafts[0] == [6, 6] and m[0] == 2
  assert drafts[1] == [] and m[1] == 0


def test_match_lengths_cap_at_ngram():
  tokens, length = _batch([[1, 2, 3, 4, 1, 2, 3, 4]])
  text = corpus_text(tokens, length, _corpus([[0]]))
  m = np.asarray(suffix_match_lengths(text, tokens, length, ngram=3))[0]
  assert m[3] == 3 and m[7] == 3 and m.max() == 3  # 2 3 4 ends at 3 and at 7 (the query)
  assert m[2] == 0 and m[8] == 0  # a NO_TOKEN separator matches nothing


def test_hybrid_choice_and_verification_of_invalid_nodes():
  tokens, length = _batch([[1, 2, 1, 2], [5, 6]])
  group, _ = group_chain(tokens, length, _corpus([[0], [1]]), depth=2)
  other = group.replace(tokens=jnp.full_like(group.tokens, 9))
  mixed = choose_drafts(jnp.asarray([True, False]), group, other)
  np.testing.assert_array_equal(np.asarray(mixed.tokens)[0], np.asarray(group.tokens)[0])
  np.testing.assert_array_equal(np.asarray(mixed.tokens)[1], [9, 9, 9])
  # A draft equal to the target's argmax is accepted only up to its first invalid node.
  logits = jnp.zeros((1, 4, 10)).at[0, jnp.arange(4), jnp.asarray([3, 4, 5, 6])].set(5.0)
  draft = jnp.asarray([[2, 3, 4, 5]])
  greedy = SamplingConfig(temperature=0.0)
  args = (draft, logits, greedy, None, jnp.zeros((1,), jnp.int32), jnp.zeros((1,), jnp.int32))
  assert int(verify_chain(*args).num_accepted[0]) == 3
  valid = jnp.asarray([[True, True, False, True]])
  res = verify_chain(*args, valid=valid)
  assert int(res.num_accepted[0]) == 1 and int(res.emitted[0, 1]) == 4  # the target's own


def test_strategy_names():
  for name in ("group8", "hybrid4", "hybrid4-argmax"):
    assert SpecStrategy.parse(name).name == name
  g = SpecStrategy.parse("group16")
  assert g.nodes == 17 and g.drafter_slots == 0 and not g.uses_drafter and g.is_chain
  assert SpecStrategy.parse("hybrid4").uses_drafter and SpecStrategy.parse("hybrid4").uses_group
  with pytest.raises(ValueError, match="argmax"):
    SpecStrategy.parse("group4-argmax")
  with pytest.raises(ValueError, match="min_match"):
    GroupMatch(min_match=0)


def test_reference_line_keeps_the_newest():
  pieces = [np.array([1, 2, 3]), np.array([4, 5])]
  np.testing.assert_array_equal(reference_line(pieces, 8), [-1, 1, 2, 3, -1, 4, 5, -1])
  np.testing.assert_array_equal(reference_line(pieces, 5), [3, -1, 4, 5, -1])
  np.testing.assert_array_equal(reference_line([], 3), [-1, -1, -1])


def test_history_keeps_the_last_rollouts_and_round_trips():
  h = PromptHistory(max_rollouts=2, context=2)
  h.add([1, 2, 3], [np.array([7, 8]), np.array([9])])
  h.add([4], [np.array([5, 5])])
  h.add([1, 2, 3], [np.array([6])])
  h.add([1, 2, 3], [np.array([0, 0, 0])])  # the first rollout of [1, 2, 3] is forgotten
  assert [list(p) for p in h.pieces([1, 2, 3])] == [[2, 3, 6], [2, 3, 0, 0, 0]]
  assert [list(p) for p in h.pieces([4])] == [[4, 5, 5]] and h.pieces([9]) == []
  state = h.state_dict()
  assert all(v.size for v in state.values())  # no empty arrays (orbax)
  back = PromptHistory(max_rollouts=2, context=2)
  back.load_state_dict({k: np.array(v) for k, v in state.items()})
  for prompt in ([1, 2, 3], [4]):
    assert [list(p) for p in back.pieces(prompt)] == [list(p) for p in h.pieces(prompt)]
  empty = PromptHistory()
  empty.load_state_dict(PromptHistory().state_dict())
  assert len(empty) == 0
  bad = dict(state, texts=state["texts"][1:])
  with pytest.raises(ValueError, match="inconsistent"):
    back.load_state_dict(bad)


def _chain(rows, valid=None):
  """A chain Draft from [B, D + 1] token rows (node 0 the root)."""
  tokens = jnp.asarray(rows, jnp.int32)
  b, n = tokens.shape
  return Draft(
    tokens=tokens,
    parents=jnp.broadcast_to(jnp.arange(-1, n - 1, dtype=jnp.int32), (b, n)),
    valid=jnp.ones((b, n), bool) if valid is None else jnp.asarray(valid),
    depth=jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n)),
    probs=jnp.ones((b, n), jnp.float32),
    scores=jnp.ones((b, n), jnp.float32),
  )


def test_hybrid_takes_the_group_draft_only_where_it_matches_long_and_agrees():
  # Rows: agrees on 2 tokens; disagrees at once; agrees on 1 only; short match; group
  # draft without a valid first node.
  group = _chain(
    [[0, 5, 6, 7], [0, 5, 6, 7], [0, 5, 9, 9], [0, 5, 6, 7], [0, 5, 6, 7]],
    valid=[[1, 1, 1, 1]] * 4 + [[1, 0, 0, 0]],
  )
  drafter = _chain([[0, 5, 6, 1], [0, 4, 6, 7], [0, 5, 6, 7], [0, 5, 6, 7], [0, 5, 6, 7]])
  match_len = jnp.asarray([4, 4, 4, 2, 4])
  pick = lambda agree: np.asarray(
    hybrid_choice(match_len, group, drafter, GroupMatch(min_match=3, agree=agree))
  ).tolist()
  assert pick(0) == [True, True, True, False, False]  # the match length alone
  assert pick(1) == [True, False, True, False, False]
  assert pick(2) == [True, False, False, False, False]
  assert pick(9) == pick(3)  # capped at the depth
  with pytest.raises(ValueError, match="agree"):
    GroupMatch(agree=-1)
