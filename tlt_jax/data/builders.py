"""tfds builders (array_record, no TensorFlow) for the synthetic tasks and local QA files.

Both builders store `{"question", "solution", "answer"}` text examples in train/test splits and
are read back with random access through `as_data_source`. `load_task_split` and
`load_local_split` build on first use (generation is local; nothing is downloaded) and return a
sequence of dicts of `str`.

Datasets are cached under `data_dir/<builder>/<config>/<version>/`. A config's name encodes
everything its data depends on (task parameters, or a hash of the local files' contents), so a
changed parameter or an edited file gets a fresh directory instead of stale data.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import io
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, overload

import tensorflow_datasets as tfds

from tlt_jax.data import checkers, tasks

__all__ = [
  "LocalQA",
  "LocalQAConfig",
  "SyntheticReasoning",
  "SyntheticReasoningConfig",
  "TextExamples",
  "check_qa_file",
  "load_local_split",
  "load_task_split",
  "local_qa_config",
  "read_qa_file",
  "split_rows",
  "synthetic_config",
]

_FILE_FORMAT = "array_record"
_SPLITS = ("train", "test")


def _text_features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict(
    {
      "question": tfds.features.Text(),
      "solution": tfds.features.Text(),
      "answer": tfds.features.Text(),
    }
  )


def _params_hash(payload: Any) -> str:
  return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Synthetic tasks.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class SyntheticReasoningConfig(tfds.core.BuilderConfig):
  """One synthetic task at one seed and size.

  Attributes:
    task: A key of `tasks.TASKS`.
    seed: Dataset seed (train uses it directly, test a seed derived from it).
    train_size: Number of train examples.
    test_size: Number of test examples (disjoint from train).
    params: Extra generator parameters as sorted (name, value) pairs; values must be
      JSON-serialisable.
  """

  task: str = "arithmetic"
  seed: int = 0
  train_size: int = 20_000
  test_size: int = 500
  params: tuple[tuple[str, Any], ...] = ()


_DEFAULT_SYNTHETIC = {
  name: SyntheticReasoningConfig(
    name=name, task=name, description=f"The {name} task at seed 0 with the default sizes."
  )
  for name in ("arithmetic", "countdown")
}


def synthetic_config(
  task: str,
  *,
  seed: int = 0,
  train_size: int = 20_000,
  test_size: int = 500,
  **params: Any,
) -> SyntheticReasoningConfig | str:
  """Returns the builder config for a task, seed, sizes and generator parameters.

  The registered config's name (e.g. "arithmetic") when everything is at its default, else a
  custom config whose name encodes the values.
  """
  params = _explicit_params(tasks.get_task(task), params)
  default = _DEFAULT_SYNTHETIC.get(task)
  sorted_params = tuple(sorted((k, _jsonable(v)) for k, v in params.items()))
  if (
    default is not None
    and not sorted_params
    and (seed, train_size, test_size) == (default.seed, default.train_size, default.test_size)
  ):
    return task
  name = f"{task}-seed{seed}-train{train_size}-test{test_size}"
  if sorted_params:
    name += f"-p{_params_hash(sorted_params)}"
  return SyntheticReasoningConfig(
    name=name,
    task=task,
    seed=seed,
    train_size=train_size,
    test_size=test_size,
    params=sorted_params,
    description=f"{task}, seed {seed}, params {dict(sorted_params)}.",
  )


def _explicit_params(spec: tasks.TaskSpec, params: Mapping[str, Any]) -> dict[str, Any]:
  """Checks generator parameters by name and drops those equal to their defaults.

  Dropping defaults gives one config (and one cache directory) per distinct dataset.
  """
  signature = inspect.signature(spec.generate)
  allowed = {
    name: p.default
    for name, p in signature.parameters.items()
    if p.kind == p.KEYWORD_ONLY and name != "start"
  }
  unknown = sorted(set(params) - set(allowed))
  if unknown:
    raise ValueError(
      f"Unknown parameters {unknown} for task {spec.name!r}; known: {sorted(allowed)}."
    )
  return {k: v for k, v in params.items() if _jsonable(v) != _jsonable(allowed[k])}


def _jsonable(value: Any) -> Any:
  # Tuples and lists hash alike in the config name; the generators accept either.
  if isinstance(value, list | tuple):
    return tuple(_jsonable(v) for v in value)
  if value is None or isinstance(value, bool | int | float | str):
    return value
  raise ValueError(f"Generator parameter value {value!r} is not a JSON scalar or sequence.")


class SyntheticReasoning(tfds.core.GeneratorBasedBuilder):
  """Synthetic reasoning tasks (`tlt_jax.data.tasks`) as a tfds dataset."""

  # Bump whenever generation changes: cached data is keyed by version.
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release: arithmetic and countdown."}
  BUILDER_CONFIGS = list(_DEFAULT_SYNTHETIC.values())

  def _info(self) -> tfds.core.DatasetInfo:
    # Built directly: `dataset_info_from_configs` looks for metadata files beside this module.
    return tfds.core.DatasetInfo(
      builder=self,
      description="Synthetic reasoning tasks with verifiable answers and long-tailed solutions.",
      features=_text_features(),
      # Keep generation order, so example i of a split is example i of `tasks.make_split`.
      disable_shuffling=True,
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict[str, str]]]]:
    del dl_manager  # Everything is generated locally.
    return {split: self._generate_examples(split) for split in _SPLITS}

  def _generate_examples(self, split: str) -> Iterator[tuple[int, dict[str, str]]]:
    config = self.builder_config
    examples = tasks.make_split(
      config.task,
      split,
      config.seed,
      train_size=config.train_size,
      test_size=config.test_size,
      **dict(config.params),
    )
    yield from enumerate(examples)


# ---------------------------------------------------------------------------------------------
# Local question/answer files.
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class LocalQAConfig(tfds.core.BuilderConfig):
  """A local `.jsonl` or `.parquet` file (or a train and a test file) of QA rows.

  Attributes:
    train_path: File with the train rows, or all rows when `test_path` is empty.
    test_path: Optional file with the test rows.
    test_fraction: Without `test_path`, this fraction of the distinct questions (at least one)
      goes to test.
    split_seed: Salt of the deterministic split.
    question_key, answer_key, solution_key: Field names in the rows (e.g. "problem" for MATH).
  """

  train_path: str = ""
  test_path: str = ""
  test_fraction: float = 0.1
  split_seed: int = 0
  question_key: str = "question"
  answer_key: str = "answer"
  solution_key: str = "solution"


def _file_digest(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def local_qa_config(
  path: str | os.PathLike[str],
  *,
  test_path: str | os.PathLike[str] | None = None,
  test_fraction: float = 0.1,
  split_seed: int = 0,
  question_key: str = "question",
  answer_key: str = "answer",
  solution_key: str = "solution",
) -> LocalQAConfig:
  """Returns the `LocalQA` config for local file(s); its name hashes their contents."""
  paths = [os.path.abspath(os.fspath(path))]
  if test_path is not None:
    paths.append(os.path.abspath(os.fspath(test_path)))
  for p in paths:
    if not os.path.isfile(p):
      raise FileNotFoundError(f"No such data file: {p}")
    _file_kind(p)
  if test_path is None and not 0.0 < test_fraction < 1.0:
    raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}.")
  keys = (question_key, answer_key, solution_key)
  fingerprint = _params_hash(
    [[_file_digest(p) for p in paths], test_path is None and test_fraction, split_seed, keys]
  )
  stem = re.sub(r"[^a-z0-9_]+", "_", os.path.basename(paths[0]).rsplit(".", 1)[0].lower())
  return LocalQAConfig(
    name=f"{stem.strip('_') or 'data'}-{fingerprint}",
    description=f"Imported from {', '.join(paths)}.",
    train_path=paths[0],
    test_path=paths[1] if len(paths) > 1 else "",
    test_fraction=test_fraction,
    split_seed=split_seed,
    question_key=question_key,
    answer_key=answer_key,
    solution_key=solution_key,
  )


def _file_kind(path: str) -> str:
  lower = path.lower()
  if lower.endswith(".jsonl"):
    return "jsonl"
  if lower.endswith(".parquet"):
    return "parquet"
  raise ValueError(f"Unsupported data file {path!r}: expected a .jsonl or .parquet file.")


def _iter_raw_rows(path: str) -> Iterator[tuple[int, Any]]:
  """Yields (1-based row number, row) pairs; for jsonl the row number is the line number."""
  name = os.path.basename(path)
  if _file_kind(path) == "jsonl":
    with open(path, encoding="utf-8") as f:
      for line_no, line in enumerate(f, start=1):
        if not line.strip():
          continue  # Blank lines (e.g. a trailing one) are not rows.
        try:
          yield line_no, json.loads(line)
        except json.JSONDecodeError as e:
          raise ValueError(f"{name}: row {line_no}: invalid JSON ({e.msg}).") from e
    return
  import pyarrow.parquet as pq  # Imported here: only parquet imports need it.

  yield from enumerate(pq.read_table(path).to_pylist(), start=1)


def _row_error(file_name: str, row_no: int, problem: str) -> ValueError:
  return ValueError(f"{file_name}: row {row_no}: {problem}")


# The row fields a local file's rows are read by, as `read_qa_file` and the job's config
# (config.task.<key>) name them.
QA_KEYS = ("question_key", "answer_key", "solution_key")


def _read_qa_rows(
  path: str, question_key: str, answer_key: str, solution_key: str
) -> list[tuple[int, dict[str, str]]]:
  """`read_qa_file`'s rows, each with its 1-based row number (the line, for jsonl)."""
  name = os.path.basename(path)
  rows = []
  for row_no, raw in _iter_raw_rows(path):
    fail = functools.partial(_row_error, name, row_no)
    if not isinstance(raw, dict):
      raise fail(f"expected a JSON object, got {type(raw).__name__}.")
    for key, field in ((question_key, "question_key"), (answer_key, "answer_key")):
      if key not in raw:
        raise fail(f"missing key {key!r} (row has keys {sorted(raw)}; the key is set by {field}).")
      if not isinstance(raw[key], str):
        raise fail(f"{key!r} must be a string, got {type(raw[key]).__name__}.")
    question, answer = raw[question_key], raw[answer_key]
    if not question.strip():
      raise fail(f"empty {question_key!r}.")
    if not answer.strip():
      raise fail(f"empty {answer_key!r}.")
    solution = raw.get(solution_key)
    if solution is None:
      solution = ""
      gsm8k_answer = checkers.extract_gsm8k_answer(answer) if "####" in answer else None
      if gsm8k_answer is not None:
        solution, answer = answer, gsm8k_answer
    elif not isinstance(solution, str):
      raise fail(f"{solution_key!r} must be a string, got {type(solution).__name__}.")
    rows.append((row_no, {"question": question, "solution": solution, "answer": answer}))
  if not rows:
    raise ValueError(f"{name}: no rows.")
  return rows


def read_qa_file(
  path: str | os.PathLike[str],
  *,
  question_key: str = "question",
  answer_key: str = "answer",
  solution_key: str = "solution",
) -> list[dict[str, str]]:
  """Reads and validates a `.jsonl` or `.parquet` file of question/answer rows.

  A row needs non-empty string `question` and `answer` fields and may have a string `solution`
  (null counts as absent). A GSM8K-style answer (a worked solution ending in `#### 42`) without
  a separate solution becomes solution = the whole text and answer = `42`.

  Args:
    path: The file.
    question_key, answer_key, solution_key: Field names in the rows.

  Returns:
    Rows as `{"question", "solution", "answer"}` dicts ("" for a missing solution).

  Raises:
    ValueError: For a malformed row; the message names the file and the 1-based row number.
  """
  rows = _read_qa_rows(os.fspath(path), question_key, answer_key, solution_key)
  return [row for _, row in rows]


# Rows shown by name when references cannot be read; the rest are counted.
_SHOWN_ROWS = 5


def check_qa_file(
  path: str | os.PathLike[str],
  *,
  question_key: str = "question",
  answer_key: str = "answer",
  solution_key: str = "solution",
  reference: Callable[[str], str | None] | None = None,
  checker: str = "",
) -> list[dict[str, str]]:
  """`read_qa_file`, then each row's reference answer as the checker will read it.

  Args:
    path: The file.
    question_key, answer_key, solution_key: Field names in the rows.
    reference: The checker's reading of a reference answer (`checkers.REFERENCE_READERS`),
      None where it is unreadable; None: the checker takes any answer.
    checker: The checker's name, for the message.

  Returns:
    The rows, as `read_qa_file` returns them.

  Raises:
    ValueError: A malformed row (file and row number), or references the checker cannot
      read: a run on them could never reward those rows, so it is refused (in one line,
      every such row counted and the first few shown).
  """
  path = os.fspath(path)
  rows = _read_qa_rows(path, question_key, answer_key, solution_key)
  bad = [] if reference is None else [(n, r) for n, r in rows if reference(r["answer"]) is None]
  if bad:
    shown = ", ".join(f"row {n} {_preview(r['answer'])}" for n, r in bad[:_SHOWN_ROWS])
    more = f" and {len(bad) - _SHOWN_ROWS} more" if len(bad) > _SHOWN_ROWS else ""
    hint = checkers.REFERENCE_FORMATS.get(checker, "")
    raise ValueError(
      f"{os.path.basename(path)}: {len(bad)} of {len(rows)} rows have a reference answer "
      f"({answer_key!r}) the {checker} checker cannot read{hint}, so no completion could "
      f"be rewarded on them: {shown}{more}."
    )
  return [row for _, row in rows]


def _preview(text: str, limit: int = 40) -> str:
  """A row's text in a message: one line, cut to `limit` characters."""
  line = " ".join(text.split())
  return repr(line if len(line) <= limit else line[: limit - 3] + "...")


def split_rows(
  rows: Sequence[dict[str, str]], test_fraction: float, split_seed: int, name: str
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
  """Splits rows into (train, test) by question, deterministically.

  The distinct questions are ranked by a salted hash and the first `round(fraction * count)`
  (at least one) go to test. Ranking by hash rather than by row index keeps the split nearly
  unchanged when rows are appended or reordered; splitting by question sends repeats of a
  question to the same side.
  """
  questions = list(dict.fromkeys(r["question"] for r in rows))
  if len(questions) < 2:
    raise ValueError(f"{name}: needs at least two distinct questions to make train and test.")

  def rank(question: str) -> bytes:
    return hashlib.sha256(f"{split_seed}/{question}".encode()).digest()

  num_test = min(len(questions) - 1, max(1, round(test_fraction * len(questions))))
  test_questions = set(sorted(questions, key=rank)[:num_test])
  train = [r for r in rows if r["question"] not in test_questions]
  test = [r for r in rows if r["question"] in test_questions]
  return train, test


class LocalQA(tfds.core.GeneratorBasedBuilder):
  """GSM8K/MATH-style question/answer rows from local `.jsonl` or `.parquet` files.

  Give the file(s) as `LocalQA(path=..., test_path=..., data_dir=...)` or as a config from
  `local_qa_config`.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def __init__(
    self,
    *,
    path: str | os.PathLike[str] | None = None,
    test_path: str | os.PathLike[str] | None = None,
    test_fraction: float = 0.1,
    split_seed: int = 0,
    config: LocalQAConfig | None = None,
    **kwargs: Any,
  ) -> None:
    if (path is None) == (config is None):
      raise ValueError("LocalQA needs exactly one of `path` and `config`.")
    if config is None:
      config = local_qa_config(
        path, test_path=test_path, test_fraction=test_fraction, split_seed=split_seed
      )
    super().__init__(config=config, **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description="Question/answer rows imported from local files.",
      features=_text_features(),
      disable_shuffling=True,  # Keep file order.
    )

  def _split_generators(self, dl_manager: Any) -> dict[str, Iterator[tuple[int, dict[str, str]]]]:
    del dl_manager  # The files are local.
    config = self.builder_config
    keys = {
      "question_key": config.question_key,
      "answer_key": config.answer_key,
      "solution_key": config.solution_key,
    }
    # Read (and validate) everything before writing, so a malformed row fails fast.
    train = read_qa_file(config.train_path, **keys)
    if config.test_path:
      test = read_qa_file(config.test_path, **keys)
    else:
      train, test = split_rows(
        train, config.test_fraction, config.split_seed, os.path.basename(config.train_path)
      )
    return {"train": self._generate_examples(train), "test": self._generate_examples(test)}

  def _generate_examples(
    self, rows: Sequence[dict[str, str]]
  ) -> Iterator[tuple[int, dict[str, str]]]:
    yield from enumerate(rows)


# ---------------------------------------------------------------------------------------------
# Loading.
# ---------------------------------------------------------------------------------------------


def _decode(value: Any) -> Any:
  return value.decode("utf-8") if isinstance(value, bytes) else value


class TextExamples(Sequence[dict[str, str]]):
  """Random-access view of a built split whose text features come back as `str`."""

  def __init__(self, source: Sequence[Mapping[str, Any]]) -> None:
    self._source = source

  def __len__(self) -> int:
    return len(self._source)

  @overload
  def __getitem__(self, index: int) -> dict[str, str]: ...

  @overload
  def __getitem__(self, index: slice) -> list[dict[str, str]]: ...

  def __getitem__(self, index: int | slice) -> dict[str, str] | list[dict[str, str]]:
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    n = len(self)
    if not -n <= index < n:
      raise IndexError(f"Index {index} out of range for {n} examples.")
    row = self._source[index % n]
    return {k: _decode(v) for k, v in row.items()}

  def __repr__(self) -> str:
    return f"TextExamples(len={len(self)})"


def _prepare_and_read(builder: tfds.core.DatasetBuilder, split: str) -> TextExamples:
  if split not in _SPLITS:
    raise ValueError(f"Unknown split {split!r}; expected one of {_SPLITS}.")
  tfds.display_progress_bar(False)  # a local build: no generate/shuffle bars on the terminal
  # tfds prints "Downloading and preparing dataset Unknown size ..." (nothing is downloaded:
  # the dataset is generated here), with a plain print that no tfds setting silences.
  with contextlib.redirect_stdout(io.StringIO()):
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False)
    )
  return TextExamples(builder.as_data_source(split=split))


def load_task_split(
  task: str,
  split: str,
  data_dir: str | os.PathLike[str],
  *,
  seed: int = 0,
  train_size: int = 20_000,
  test_size: int = 500,
  **params: Any,
) -> TextExamples:
  """Builds a synthetic task's dataset if needed and returns one split.

  Args:
    task: A key of `tasks.TASKS` ("arithmetic", "countdown").
    split: "train" or "test".
    data_dir: Root directory of the tfds datasets.
    seed: Dataset seed.
    train_size: Number of train examples.
    test_size: Number of test examples.
    **params: Generator parameters (see `tasks.generate_<task>`).

  Returns:
    A random-access sequence of `{"question", "solution", "answer"}` dicts of `str`, in
    generation order.
  """
  config = synthetic_config(task, seed=seed, train_size=train_size, test_size=test_size, **params)
  builder = SyntheticReasoning(
    config=config, data_dir=os.fspath(data_dir), file_format=_FILE_FORMAT
  )
  return _prepare_and_read(builder, split)


def load_local_split(
  path: str | os.PathLike[str],
  split: str,
  data_dir: str | os.PathLike[str],
  *,
  test_path: str | os.PathLike[str] | None = None,
  test_fraction: float = 0.1,
  split_seed: int = 0,
  question_key: str = "question",
  answer_key: str = "answer",
  solution_key: str = "solution",
) -> TextExamples:
  """Imports local QA file(s) into tfds if needed and returns one split.

  Args:
    path: `.jsonl` or `.parquet` file with the train rows, or all rows without `test_path`.
    split: "train" or "test".
    data_dir: Root directory of the tfds datasets.
    test_path: Optional file with the test rows.
    test_fraction: Without `test_path`, this fraction of the distinct questions (at least one)
      goes to test, chosen by a hash of the question so the split is deterministic.
    split_seed: Salt of that hash.
    question_key, answer_key, solution_key: Field names in the rows.

  Returns:
    A random-access sequence of `{"question", "solution", "answer"}` dicts of `str`, in file
    order.

  Raises:
    ValueError: For a malformed row (the message has the file name and row number).
  """
  config = local_qa_config(
    path,
    test_path=test_path,
    test_fraction=test_fraction,
    split_seed=split_seed,
    question_key=question_key,
    answer_key=answer_key,
    solution_key=solution_key,
  )
  builder = LocalQA(config=config, data_dir=os.fspath(data_dir), file_format=_FILE_FORMAT)
  return _prepare_and_read(builder, split)
