"""The workdir as a job leaves it: one job at a time (an OS lock the kernel drops
with its holder), a run that fails its checks touches nothing, and a rerun after a kill
before the first checkpoint starts over instead of appending to the killed run's rows."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from tlt_jax import workdir as workdir_lock
from tlt_jax.models.config import ModelConfig
from tlt_jax.models.hf_io import save_hf_checkpoint
from tlt_jax.models.transformer import init_model
from tlt_jax.rl.checkpoints import TrainerCheckpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The finished run the tests start from: one RL step, no closing rollout report.
_TINY = [
  "--config=configs/default.py:tiny",
  "--config.rl.steps=1",
  "--config.rollout.num_prompts=0",
]


def _cli(*args, timeout=600):
  return subprocess.run(
    [sys.executable, "-m", "tlt_jax.main", *args],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=timeout,
  )


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished tiny run's workdir (left as it is: tests copy it to change it)."""
  wd = str(tmp_path_factory.mktemp("finished") / "wd")
  out = _cli(*_TINY, f"--workdir={wd}")
  assert out.returncode == 0, out.stderr[-3000:]
  return wd


def _snapshot(top):
  """Every path under `top` with its bytes' digest (a link: its target) and mtime."""
  out = {}
  for root, dirs, files in os.walk(top):
    for name in dirs + files:
      path = os.path.join(root, name)
      if os.path.islink(path):
        out[path] = ("link", os.readlink(path))
      elif os.path.isfile(path):
        with open(path, "rb") as f:
          out[path] = (hashlib.sha256(f.read()).hexdigest(), os.stat(path).st_mtime_ns)
      else:
        out[path] = ("dir",)
  return out


def test_runs_that_fail_their_checks_leave_a_finished_workdir_byte_for_byte(finished, tmp_path):
  """A bad checkpoint path, a checkpoint whose RoPE is not supported, a malformed data file,
  a negative step count, warm starts built from another SFT recipe: each fails in one line
  (exit status 2) before the job writes anything: config.json, summary.json, the log and
  the lock file stay as they were."""
  rope = tmp_path / "rope_ckpt"
  config = ModelConfig(
    vocab_size=100, num_layers=1, d_model=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_dim=32
  )
  save_hf_checkpoint(init_model(config, seed=0), config, rope, model_type="llama")
  hf = json.loads((rope / "config.json").read_text())
  hf["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
  (rope / "config.json").write_text(json.dumps(hf))
  data = tmp_path / "gsm8k.jsonl"
  data.write_text('{"question": "1+1?", "answer": "#### 2"}\n{"question": "2+2?",\n')
  before = _snapshot(finished)
  assert any(p.endswith("summary.json") for p in before)
  failing = {
    "--config.model.checkpoint=/nonexistent/model": "no such directory",
    f"--config.model.checkpoint={rope}": "rope_type 'yarn' is not supported",
    f"--config.task.path={data}": "gsm8k.jsonl: row 2: invalid JSON",
    "--config.rl.steps=-1": "config.rl.steps must be an int >= 0",
    # The workdir's warm starts were built from other SFT settings: not silently reused.
    "--config.sft.steps=1234": "1234 here); use another --workdir",
  }
  for override, message in failing.items():
    extra = ["--config.task.name=local"] if "task.path" in override else []
    out = _cli(*_TINY, f"--workdir={finished}", *extra, override)
    assert out.returncode == 2, (override, out.stderr[-3000:])
    assert out.stderr.startswith("error: ") and out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert message in out.stderr
    assert _snapshot(finished) == before, override


def test_a_second_job_on_a_locked_workdir_is_refused_naming_the_holder(tmp_path):
  wd = tmp_path / "wd"
  with workdir_lock.hold(str(wd)) as lock:
    with open(lock) as f:
      holder = f.read()
    assert f"pid {os.getpid()} on {socket.gethostname()}, started 20" in holder
    out = _cli(*_TINY, f"--workdir={wd}", timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: workdir {wd} is in use by another job (pid {os.getpid()}")
    assert os.listdir(wd) == [workdir_lock.LOCK_NAME]  # the refused job wrote nothing
    with open(lock) as f:
      assert f.read() == holder
  # Released at the end of the block: the next job takes it.
  with workdir_lock.hold(str(wd)):
    pass


def test_the_kernel_drops_the_lock_of_a_killed_job(tmp_path):
  """kill -9 leaves the lock file, not the lock: the rerun (kill-and-resume) goes ahead."""
  wd = str(tmp_path / "wd")
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time\n"
      "from tlt_jax import workdir\n"
      f"with workdir.hold({wd!r}):\n"
      "  print('held', flush=True)\n"
      "  time.sleep(600)\n",
    ],
    cwd=ROOT,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lock.WorkdirBusy, match=f"pid {holder.pid} on "):
      workdir_lock.hold(wd).__enter__()
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  with workdir_lock.hold(wd) as lock, open(lock) as f:
    assert f.read().startswith(f"pid {os.getpid()} ")


def _lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_no_checkpoint_drops_what_a_killed_run_left(tmp_path):
  """A run killed before its first checkpoint left rows (one cut short by the kill) and
  TensorBoard events: the next run starts at step 0 without them."""
  wd = tmp_path / "wd"
  (wd / "tensorboard").mkdir(parents=True)
  (wd / "tensorboard" / "events.out.tfevents.1.vm").write_bytes(b"old")
  rows = "".join(json.dumps({"step": s, "reward_mean": 0.5}) + "\n" for s in range(4))
  (wd / "metrics.jsonl").write_text(rows + '{"step": 4, "rew')
  (wd / "rollout_lengths.jsonl").write_text(rows)
  (wd / "rollout_timelines.jsonl").write_text(rows + '{"step": 4, "rollouts": [{"wa')
  ckpt = TrainerCheckpoints(str(wd), with_drafter=False)
  ckpt.restore(None)  # no checkpoint: nothing of the trainer is read
  assert ckpt.resumed_at is None and ckpt.dropped_rows == 5
  kept = [
    (wd / f"{f}.jsonl").read_text() for f in ("metrics", "rollout_lengths", "rollout_timelines")
  ]
  assert kept == ["", "", ""]
  assert not (wd / "tensorboard").exists()
  note = ckpt.start_note(8)
  assert note.startswith("RL starts at step 0 of 8: no RL checkpoint in") and "5 metrics" in note


def test_a_rerun_without_a_checkpoint_has_one_row_per_step(finished, tmp_path):
  """The reported run: killed before its first checkpoint, rerun, it appended its rows to the
  killed run's (12 rows for 8 steps, "after 12 GRPO steps"). The finished run's checkpoints
  removed stand for that kill: its metrics rows stay, its checkpoints do not."""
  wd = str(tmp_path / "wd")
  shutil.copytree(finished, wd)
  shutil.rmtree(os.path.join(wd, "checkpoints"))
  os.remove(os.path.join(wd, "summary.json"))
  assert [r["step"] for r in _lines(os.path.join(wd, "metrics.jsonl"))] == [0]
  out = _cli(*_TINY, f"--workdir={wd}")
  assert out.returncode == 0, out.stderr[-3000:]
  assert [r["step"] for r in _lines(os.path.join(wd, "metrics.jsonl"))] == [0]
  assert [r["step"] for r in _lines(os.path.join(wd, "rollout_lengths.jsonl"))] == [0]
  assert "RL starts at step 0 of 1: no RL checkpoint in" in out.stderr
  with open(os.path.join(wd, "summary.json")) as f:
    summary = json.load(f)
  assert summary["rl"]["steps"] == 1 and summary["rl"]["resumed_at_step"] is None
  assert "after 1 GRPO steps" in out.stdout
