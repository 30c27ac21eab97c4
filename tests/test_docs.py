"""The library guide's first example runs as written (docs/library.md)."""

import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "library.md"


def test_the_rollout_engine_example_runs():
  blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
  assert len(blocks) >= 2, "docs/library.md lost its examples"
  scope: dict = {}
  exec(compile(blocks[0], str(DOC), "exec"), scope)
  result = scope["result"]
  # Two prompts x 8 samples, every row generated something, speculative chunks ran.
  assert len(result.num_generated) == 16 and (result.num_generated > 0).all()
  assert result.hidden is not None and scope["engine"].bandit.state_dict()
