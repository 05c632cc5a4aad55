"""Run ids that survive upgrades (`train.run_ids`): a field added with a default leaves every run id as it was, and
a run folder named by the old rule (every field hashed) is resumed by the same command."""
import dataclasses
import json
from pathlib import Path

import pytest

from jaxpod.tasks.trm_sudoku import SudokuData, TrmSudokuConfig
from jaxpod.train.config import TrainConfig, TrainerConfig, legacy_run_id, run_id
from tests.train.conftest import tiny_args, tiny_config

# What jaxpod at commit 02776ac (the old rule) named these commands' run folders (see the file's note).
LEGACY = json.loads((Path(__file__).parents[1] / "data" / "golden" / "legacy_run_ids.json").read_text())


def _with_new_field(cls, name: str = "new_knob", default=3):
  """`cls` as a later jaxpod might have it: one more field, with a default."""
  return dataclasses.make_dataclass(cls.__name__, [(name, int, dataclasses.field(default=default))], bases=(cls,),
                                    frozen=True)


def test_a_field_added_with_a_default_keeps_the_run_id_and_setting_it_changes_it():
  Trainer, Data = _with_new_field(TrainerConfig), _with_new_field(SudokuData)
  before = TrainConfig(trainer=TrainerConfig(seed=1))
  after = TrainConfig(trainer=Trainer(seed=1), task=TrmSudokuConfig(data=Data()))
  assert run_id(after, "trm") == run_id(before, "trm")
  assert run_id(TrainConfig(trainer=Trainer(seed=1, new_knob=4)), "trm") != run_id(before, "trm")


def test_the_old_rule_is_rebuilt_for_commands_of_every_root():
  """The name 02776ac gave each command, rebuilt from its default trees with the command's changes on top (options
  renamed since under their old names: rl's `task` is `problems` now, `task.lora_lr_scale` is `task.lora.lr_scale`);
  still the same once a field was added with its default, and none once the command sets a field it did not have."""
  from jaxpod.cli import rl as cli_rl, train as cli_train
  from jaxpod.cli.args import parse
  from jaxpod.problems import ProblemSet
  from jaxpod.rl.run import RUN_ID_IGNORES
  from jaxpod.train.run_ids import legacy_run_id as rl_legacy
  for key, prefix in (("train_tiny", "trm"), ("train_default", "trm"), ("preference_default", "pref"),
                      ("preference_lora_lr_scale", "pref")):
    args = LEGACY[key]["args"]
    cfg = parse(TrainConfig, args, "test") if key == "train_tiny" else cli_train.load_config(args)
    assert legacy_run_id(cfg, prefix) == LEGACY[key]["id"], key
  for key in ("rl_tiny", "rl_default", "rl_python", "rl_addition_digits"):
    cfg = cli_rl.load_config(LEGACY[key]["args"])
    kind = ProblemSet.get_choice_name(type(cfg.problems))
    assert rl_legacy(cfg, "rl", RUN_ID_IGNORES, "rl", kind) == LEGACY[key]["id"], key
  cfg = parse(TrainConfig, LEGACY["train_tiny"]["args"], "test")
  Trainer = _with_new_field(TrainerConfig)
  grown = dataclasses.replace(cfg, trainer=Trainer(**dataclasses.asdict(cfg.trainer)))
  assert legacy_run_id(grown, "trm") == LEGACY["train_tiny"]["id"]
  assert legacy_run_id(dataclasses.replace(cfg, trainer=Trainer(**dataclasses.asdict(cfg.trainer), new_knob=4)),
                       "trm") is None


@pytest.mark.slow
def test_a_run_started_under_the_old_rule_resumes_with_the_same_command(tmp_path, data_dir):
  """The run as jaxpod before the change left it: trained 4 steps in the folder the old rule named (the trainer
  writes the same folder whatever names it). The same command after the upgrade resumes it at step 4 instead of
  starting a new run from step 0."""
  from jaxpod.train import train
  runs = tmp_path / "runs"
  assert tiny_args("RUNS", "DATA", 4) == LEGACY["train_tiny"]["args"]  # the command the old name is for
  old = train(tiny_config(runs, data_dir, steps=4, trainer__run_name=LEGACY["train_tiny"]["id"]))
  again = train(tiny_config(runs, data_dir, steps=6))
  assert again.run_dir == old.run_dir and again.resumed and (again.start_step, again.final_step) == (4, 6)
  assert sorted(p.name for p in runs.iterdir()) == [LEGACY["train_tiny"]["id"]]  # no second folder


def test_an_rl_run_folder_named_by_the_old_rule_is_the_run_folder(tmp_path):
  """Every job of an RL run (trainer, rollout workers) finds its folder by `run_dir`: the old one when only it
  exists, else the new name."""
  from jaxpod.cli import rl as cli_rl
  from jaxpod.rl.run import run_dir, run_id
  cfg = cli_rl.load_config([*LEGACY["rl_tiny"]["args"], "--trainer.runs_dir", str(tmp_path)])
  assert run_dir(cfg) == f"{tmp_path}/{run_id(cfg)}" != f"{tmp_path}/{LEGACY['rl_tiny']['id']}"
  (tmp_path / LEGACY["rl_tiny"]["id"]).mkdir()
  assert run_dir(cfg) == f"{tmp_path}/{LEGACY['rl_tiny']['id']}"
