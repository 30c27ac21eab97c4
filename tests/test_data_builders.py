"""Tests for tlt_jax.data.builders (tfds, array_record, no TensorFlow)."""

import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tlt_jax.data import builders, tasks

SIZES = {"train_size": 40, "test_size": 8}

ROWS = [
  {"question": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"{i}+{i}={2 * i}"}
  for i in range(30)
]


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
def test_synthetic_builds_and_reads_back(task, tmp_path):
  for split in ("train", "test"):
    data = builders.load_task_split(task, split, tmp_path, seed=3, **SIZES)
    expected = tasks.make_split(task, split, 3, **SIZES)
    assert len(data) == len(expected)
    assert list(data) == expected
    assert all(type(v) is str for ex in data for v in ex.values())
  assert (tmp_path / "synthetic_reasoning" / f"{task}-seed3-train40-test8").is_dir()
  # TensorFlow stays out of the process.
  assert "tensorflow" not in sys.modules


def test_synthetic_reuses_and_separates_configs(tmp_path):
  first = builders.load_task_split("arithmetic", "train", tmp_path, **SIZES)
  files = sorted((tmp_path / "synthetic_reasoning").rglob("*array_record*"))
  mtimes = [f.stat().st_mtime_ns for f in files]
  again = builders.load_task_split("arithmetic", "train", tmp_path, **SIZES)
  assert list(again) == list(first)
  assert [f.stat().st_mtime_ns for f in files] == mtimes  # Not rebuilt.
  shorter = builders.load_task_split("arithmetic", "train", tmp_path, max_steps=2, **SIZES)
  assert all(ex["solution"].count(";") <= 2 for ex in shorter)
  assert list(shorter) != list(first)


def test_synthetic_config_names():
  assert builders.synthetic_config("countdown") == "countdown"
  custom = builders.synthetic_config("countdown", seed=1, max_number=9)
  assert custom.name.startswith("countdown-seed1-train20000-test500-p")
  assert custom.params == (("max_number", 9),)
  assert builders.synthetic_config("countdown", number_counts=[3, 4]).name == (
    builders.synthetic_config("countdown", number_counts=(3, 4)).name
  )
  # Parameters at their defaults do not make a new dataset.
  assert builders.synthetic_config("arithmetic", max_steps=40, median_steps=3.5) == "arithmetic"
  with pytest.raises(ValueError, match="Unknown task"):
    builders.synthetic_config("sudoku")
  with pytest.raises(ValueError, match=r"Unknown parameters \['max_step'\]"):
    builders.synthetic_config("arithmetic", max_step=3)


def test_text_examples_indexing(tmp_path):
  data = builders.load_task_split("arithmetic", "test", tmp_path, **SIZES)
  expected = tasks.make_split("arithmetic", "test", 0, **SIZES)
  assert data[-1] == expected[-1]
  assert data[2:5] == expected[2:5]
  with pytest.raises(IndexError):
    data[len(data)]
  with pytest.raises(ValueError, match="Unknown split"):
    builders.load_task_split("arithmetic", "validation", tmp_path, **SIZES)


def test_local_jsonl_single_file_split(tmp_path):
  path = _write_jsonl(tmp_path / "qa.jsonl", ROWS)
  train = builders.load_local_split(path, "train", tmp_path / "tfds", test_fraction=0.2)
  test = builders.load_local_split(path, "test", tmp_path / "tfds", test_fraction=0.2)
  assert len(test) == 6 and len(train) == 24
  assert not {ex["question"] for ex in train} & {ex["question"] for ex in test}
  assert sorted(list(train) + list(test), key=lambda r: r["question"]) == sorted(
    ROWS, key=lambda r: r["question"]
  )
  # Train keeps file order.
  order = [r["question"] for r in ROWS]
  assert [order.index(ex["question"]) for ex in train] == sorted(
    order.index(ex["question"]) for ex in train
  )
  # The split depends only on the contents: another data_dir gives the same one.
  again = builders.load_local_split(path, "test", tmp_path / "tfds2", test_fraction=0.2)
  assert list(again) == list(test)


def test_local_two_files_and_gsm8k_answers(tmp_path):
  train_path = _write_jsonl(tmp_path / "train.jsonl", ROWS[:20])
  gsm8k = [{"question": "Q?", "answer": "Half of 48 is 24.\n48+24=72\n#### 72"}]
  test_path = _write_jsonl(tmp_path / "test.jsonl", gsm8k + [ROWS[25]])
  train = builders.load_local_split(train_path, "train", tmp_path, test_path=test_path)
  test = builders.load_local_split(train_path, "test", tmp_path, test_path=test_path)
  assert list(train) == ROWS[:20]
  assert test[0] == {"question": "Q?", "solution": gsm8k[0]["answer"], "answer": "72"}
  assert test[1] == ROWS[25]


def test_local_parquet(tmp_path):
  # A nullable solution column: null means no solution.
  rows = [{"problem": r["question"], "answer": r["answer"], "solution": None} for r in ROWS]
  rows[3]["solution"] = "worked"
  table = pa.Table.from_pylist(rows)
  pq.write_table(table, tmp_path / "math.parquet")
  train = builders.load_local_split(
    tmp_path / "math.parquet", "train", tmp_path / "tfds", question_key="problem"
  )
  test = builders.load_local_split(
    tmp_path / "math.parquet", "test", tmp_path / "tfds", question_key="problem"
  )
  assert len(train) + len(test) == len(rows) and len(test) == 3
  everything = {ex["question"]: ex for ex in [*train, *test]}
  assert everything[ROWS[3]["question"]]["solution"] == "worked"
  assert everything[ROWS[4]["question"]] == {**ROWS[4], "solution": ""}


def test_local_qa_builder_from_path(tmp_path):
  path = _write_jsonl(tmp_path / "qa.jsonl", ROWS)
  builder = builders.LocalQA(path=path, data_dir=tmp_path / "tfds", file_format="array_record")
  builder.download_and_prepare()
  source = builder.as_data_source(split="train")
  assert len(source) + len(builder.as_data_source(split="test")) == len(ROWS)
  with pytest.raises(ValueError, match="exactly one"):
    builders.LocalQA(data_dir=tmp_path / "tfds")


@pytest.mark.parametrize(
  ("lines", "row", "problem"),
  [
    (
      ['{"question": "a", "answer": "1"}', "{not json", '{"question": "b", "answer": "2"}'],
      2,
      "JSON",
    ),
    (['{"question": "a", "answer": "1"}', '{"question": "b"}'], 2, "missing key 'answer'"),
    (['{"question": "a", "answer": 1}'], 1, "must be a string"),
    (['{"question": "a", "answer": "1"}', "", '{"question": "  ", "answer": "1"}'], 3, "empty"),
    (['{"question": "a", "answer": "1", "solution": 5}'], 1, "'solution' must be a string"),
    (['["a", "1"]'], 1, "JSON object"),
    (['{"question": "a", "answer": ""}'], 1, "empty 'answer'"),
  ],
)
def test_malformed_jsonl_rows(tmp_path, lines, row, problem):
  path = tmp_path / "bad.jsonl"
  path.write_text("\n".join(lines) + "\n")
  with pytest.raises(ValueError, match=rf"bad\.jsonl: row {row}: .*{problem}"):
    builders.read_qa_file(path)


def test_malformed_row_fails_the_build(tmp_path):
  path = _write_jsonl(tmp_path / "qa.jsonl", [*ROWS[:5], {"question": "x", "answer": None}])
  with pytest.raises(ValueError, match=r"qa\.jsonl: row 6: 'answer' must be a string"):
    builders.load_local_split(path, "train", tmp_path / "tfds")


def test_malformed_parquet_rows(tmp_path):
  pq.write_table(
    pa.Table.from_pylist([{"question": "a", "answer": "1"}, {"question": "b", "answer": None}]),
    tmp_path / "nulls.parquet",
  )
  with pytest.raises(ValueError, match=r"nulls\.parquet: row 2: 'answer' must be a string"):
    builders.read_qa_file(tmp_path / "nulls.parquet")
  pq.write_table(pa.Table.from_pylist([{"question": "a"}]), tmp_path / "nocol.parquet")
  with pytest.raises(ValueError, match=r"nocol\.parquet: row 1: missing key 'answer'"):
    builders.read_qa_file(tmp_path / "nocol.parquet")


def test_local_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError):
    builders.load_local_split(tmp_path / "missing.jsonl", "train", tmp_path)
  (tmp_path / "data.csv").write_text("question,answer\n")
  with pytest.raises(ValueError, match="jsonl or .parquet"):
    builders.load_local_split(tmp_path / "data.csv", "train", tmp_path)
  path = _write_jsonl(tmp_path / "one.jsonl", ROWS[:1])
  with pytest.raises(ValueError, match="two distinct questions"):
    builders.load_local_split(path, "train", tmp_path)
  with pytest.raises(ValueError, match="test_fraction"):
    builders.load_local_split(path, "train", tmp_path, test_fraction=1.0)


def test_package_import_defers_tfds():
  code = (
    "import sys, tlt_jax.data as d\n"
    "assert 'tensorflow_datasets' not in sys.modules\n"
    "assert callable(d.load_task_split)\n"
    "assert 'tensorflow_datasets' in sys.modules\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True)
