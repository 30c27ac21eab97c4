"""Every Python example of the library guide (docs/library.md) runs as written, on its own
(a fresh namespace, in a scratch directory), and does what its text says."""

from __future__ import annotations

import pathlib
import re
import time

import numpy as np
import pytest

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "library.md"


def _examples() -> list[tuple[str, str]]:
  """(section heading, code) of each ```python block, in order."""
  out, heading = [], ""
  pattern = r"(^## [^\n]*$|^```python\n.*?^```$)"
  for part in re.split(pattern, DOC.read_text(), flags=re.M | re.S):
    if part.startswith("## "):
      heading = part[3:].strip()
    elif part.startswith("```python"):
      out.append((heading, part[len("```python\n") : -len("```")]))
  return out


EXAMPLES = _examples()


def _check_engine(scope):
  result = scope["result"]
  # Two prompts x 4 samples, every row generated something, speculative chunks ran.
  assert len(result.num_generated) == 8 and (result.num_generated > 0).all()
  assert result.hidden is not None and scope["engine"].bandit.state_dict()
  assert result.spec_summary()["row_rounds"] > 0


def _check_trainer(scope):
  history = scope["history"]
  assert [r["step"] for r in history] == [0, 1]
  assert history[-1]["drafter/version"] >= 2  # the online drafter trained every step
  assert "eval" in history[-1] and pathlib.Path("runs/my_rl/metrics.jsonl").is_file()


def _check_losses(scope):
  losses = scope["losses"]
  values = {name: float(loss) for name, (loss, _) in losses.items()}
  assert all(np.isfinite(v) for v in values.values()) and len(set(values.values())) == 5
  _, tis = losses["tis"]
  assert 0 < float(tis["tis_weight_mean"]) <= 2.0
  assert "clip_fraction_dual" in losses["dual clip"][1]


def _check_rewards(scope):
  assert callable(scope["reward"]) and callable(scope["same"])


def _check_reward_batch(scope):
  assert scope["batch"].done() and not scope["batch"].missing()


def _check_export(scope):
  assert scope["summary"]["model_type"] == "llama"
  assert pathlib.Path("runs/my_policy_hf/generation_config.json").is_file()


CHECKS = {
  "The rollout engine": _check_engine,
  "The trainer, with TLT": _check_trainer,
  "Loss options": _check_losses,
  "Rewards": _check_rewards,
  "Rewards scored as rows finish": _check_reward_batch,
  "Taking the trained policy away": _check_export,
}


def test_every_example_is_checked():
  assert len(EXAMPLES) >= 5, "docs/library.md lost its examples"
  assert sorted({h for h, _ in EXAMPLES}) == sorted(CHECKS)


def test_the_layout_table_names_every_part_of_the_package():
  """The guide's map of the source stays whole: each package folder and top-level module
  of tlt_jax appears in the Layout table (a newcomer looks there first)."""
  table = DOC.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
  package = DOC.parents[1] / "tlt_jax"
  parts = [p.name for p in package.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
  parts += [p.name for p in package.glob("*.py") if p.name != "__init__.py"]
  assert len(parts) > 10
  missing = [
    name
    for name in sorted(parts)
    if f"`tlt_jax/{name}" not in table and not re.search(rf"`{re.escape(name)}`", table)
  ]
  assert not missing, f"docs/library.md's Layout table does not name {missing}"


def test_the_experiments_index_names_every_script():
  """experiments/README.md has a line for each script there, and names no script that is
  gone."""
  folder = DOC.parents[1] / "experiments"
  index = (folder / "README.md").read_text()
  scripts = {p.name for p in folder.iterdir() if p.suffix in (".py", ".sh")}
  named = set(re.findall(r"`([\w.]+\.(?:py|sh))`", index))
  assert len(scripts) > 20
  assert not scripts - named, f"experiments/README.md does not name {sorted(scripts - named)}"
  assert not named - scripts, f"experiments/README.md names missing {sorted(named - scripts)}"


@pytest.mark.parametrize("code", [c for _, c in EXAMPLES], ids=[h for h, _ in EXAMPLES])
def test_example_runs(code, tmp_path, monkeypatch):
  heading = next(h for h, c in EXAMPLES if c == code)
  if heading == "Taking the trained policy away":
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
  monkeypatch.chdir(tmp_path)  # examples write under runs/
  scope: dict = {"__name__": "__docs__"}
  start = time.perf_counter()
  exec(compile(code, f"{DOC} ({heading})", "exec"), scope)
  seconds = time.perf_counter() - start
  CHECKS[heading](scope)
  print(f"{heading}: {seconds:.1f} s")
