"""Config validation (invariant 7: errors found before JAX initialises name the field) and shipped configs."""
from pathlib import Path

import pytest

from jaxpod.cli.args import UsageError, parse
from jaxpod.runtime import HostInfo, MeshConfig
from jaxpod.train import TrainConfig
from jaxpod.tasks.trm_sudoku import SudokuData, TrmSudokuConfig
from jaxpod.train.config import TrainerConfig, validate_for_hosts

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs").glob("train_*.yaml")) + sorted((REPO / "configs").glob("trm_*.yaml"))


def _cfg(**data):
  return TrainConfig(task=TrmSudokuConfig(data=SudokuData(**data)))


def test_batch_not_divisible_by_hosts_names_the_field():
  """Invariant 7: a global batch that does not split over the hosts is refused before JAX init."""
  hosts = HostInfo(process_index=0, process_count=3, coordinator="127.0.0.1:1", source="config")
  with pytest.raises(ValueError, match=r"data\.global_batch_size=64 .*3 hosts"):
    validate_for_hosts(_cfg(global_batch_size=64, eval_batch_size=96), hosts)


def test_batch_not_divisible_by_data_parallel_size_names_the_field():
  """Invariant 7: 2 hosts x 4 devices -> data-parallel 8; a batch of 36 splits over hosts but not devices."""
  hosts = HostInfo(process_index=0, process_count=2, coordinator="127.0.0.1:1", devices_per_host=4, source="config")
  with pytest.raises(ValueError, match=r"data\.global_batch_size=36 .*data-parallel size 8"):
    validate_for_hosts(_cfg(global_batch_size=36, eval_batch_size=64), hosts)


def test_mesh_not_dividing_devices_names_the_mesh():
  """Invariant 7: mesh sizes that do not fit the device count are refused before JAX init."""
  hosts = HostInfo(process_index=0, process_count=2, coordinator="127.0.0.1:1", devices_per_host=2, source="config")
  cfg = TrainConfig(mesh=MeshConfig(data=3, fsdp=1, model=1))
  with pytest.raises(ValueError, match=r"mesh.*needs 3 devices but 4"):
    validate_for_hosts(cfg, hosts)


@pytest.mark.parametrize("field,value,match", [
    ("task.data.global_batch_size", 0, "task.data.global_batch_size"),
    ("trainer.steps", 0, "trainer.steps"),
    ("trainer.ema", 1.0, "trainer.ema"),
    ("task.model.seq_len", 81, "task.model.seq_len=81 does not match task.data.box"),
    ("task.data.global_batch_size", 4096, "exceeds task.data.num_train"),
])
def test_cli_errors_name_the_field(field, value, match, capsys):
  """Bad values end `jaxpod train` with one line naming the field (exit 2), before anything runs."""
  with pytest.raises(UsageError):
    parse(TrainConfig, [f"--{field}={value}"], "jaxpod train")
  assert match in capsys.readouterr().err


def test_validation_runs_before_jax_initialises(tmp_path):
  """`train` refuses a bad batch before runtime.init (no distributed client, no backend touched)."""
  from jaxpod import runtime
  from jaxpod.runtime import RuntimeConfig
  from jaxpod.train import train
  cfg = TrainConfig(runtime=RuntimeConfig(num_processes=3, process_id=0, coordinator="127.0.0.1:9"),
                    trainer=TrainerConfig(runs_dir=str(tmp_path)))
  was = runtime.is_initialized()
  with pytest.raises(ValueError, match=r"data.global_batch_size=32 is not divisible by the 3 hosts"):
    train(cfg)
  assert runtime.is_initialized() == was


@pytest.mark.parametrize("path", SHIPPED + ["embedded"], ids=lambda p: getattr(p, "name", p))
def test_every_shipped_config_parses(path):
  """Every YAML in configs/ and the embedded default parse and validate."""
  from jaxpod.cli.train import load_config
  cfg = load_config([] if path == "embedded" else ["--config_path", str(path)])
  assert cfg.trainer.steps > 0


def test_paper_recipe_config_matches_the_paper():
  """`jaxpod train --config_path configs/trm_sudoku_mlp.yaml`: the paper's recipe (50k epochs of 1000 at batch 768)."""
  from jaxpod.cli.train import load_config
  from jaxpod.models.trm import TRMConfig
  cfg = load_config(["--config_path", str(REPO / "configs" / "trm_sudoku_mlp.yaml"), "--trainer.seed=3"])
  assert cfg.task.model == TRMConfig.sudoku_mlp() and cfg.task.data.box == "3x3"
  assert cfg.task.data.global_batch_size == 768 and cfg.task.optim.lr == 1e-4 and cfg.trainer.ema == 0.999
  assert cfg.trainer.steps == 65105 and cfg.trainer.seed == 3  # ceil(50000 * 1000 / 768); overrides still apply


def test_python_defaults_are_the_embedded_default():
  """`TrainConfig()` and `jaxpod train` with no arguments describe the same run."""
  from jaxpod.cli.train import load_config
  embedded, default = load_config([]), TrainConfig()
  assert embedded.task == default.task and type(default.task).__name__ == "TrmSudokuConfig"
  assert embedded.trainer.steps == default.trainer.steps and embedded.trainer.ema == default.trainer.ema


def test_cli_reports_host_errors_in_one_line(capsys):
  """`jaxpod train` with a batch that does not split over the hosts: exit 2, one line, no JAX init."""
  from jaxpod import runtime
  from jaxpod.cli.main import main
  was = runtime.is_initialized()
  code = main(["train", "--runtime.num_processes=3", "--runtime.process_id=0", "--runtime.coordinator=127.0.0.1:9"])
  err = capsys.readouterr().err.strip().splitlines()
  assert code == 2 and len(err) == 1 and "data.global_batch_size=32 is not divisible by the 3 hosts" in err[0]
  assert runtime.is_initialized() == was


@pytest.mark.parametrize("argv,match", [
    (["--model.hidden_size=32"], "--model.hidden_size moved under task: use --task.model.hidden_size"),
    (["--data.box=2x3"], "--data.box moved under task: use --task.data.box"),
    (["--lm.lr=0.1"], "use task (task: {type: causal_lm, ...}; lm.lr -> task.optim.lr"),
    ("old.yaml", "top-level `model:` moved under `task:`"),
])
def test_old_keys_get_one_line_naming_the_new_key(argv, match, tmp_path, capsys):
  """Configs written before `task:` (top-level data/model/optim/lm): exit 2, one line naming the new key."""
  from jaxpod.cli.main import main
  if argv == "old.yaml":
    (tmp_path / "old.yaml").write_text("model:\n  hidden_size: 32\ntrainer:\n  steps: 3\n")
    argv = ["--config_path", str(tmp_path / "old.yaml")]
  assert main(["train", *argv]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and match in err[0], err


def test_task_is_chosen_by_type_in_yaml_or_on_the_command_line(tmp_path):
  """`task: {type: NAME}` in a file, `--task.type NAME` on the command line; unknown names are refused."""
  from jaxpod.cli.train import load_config
  from jaxpod.tasks.causal_lm import CausalLMConfig
  cfg = load_config(["--task.type", "causal_lm", "--task.optim.warmup_steps", "3"])
  assert isinstance(cfg.task, CausalLMConfig) and cfg.task.optim.warmup_steps == 3
  (tmp_path / "lm.yaml").write_text("task:\n  type: causal_lm\n  data: {seq_len: 64}\n")
  assert load_config(["--config_path", str(tmp_path / "lm.yaml")]).task.data.seq_len == 64
  with pytest.raises(SystemExit) as e:
    load_config(["--task.type", "no_such_task"])
  assert e.value.code == 2


def test_run_id_is_a_hash_of_the_config_without_the_ignored_fields():
  """Same recipe, same run folder; the ignored fields (where, how often) do not count; the task type does."""
  from jaxpod.tasks.causal_lm import CausalLMConfig
  from jaxpod.train.config import run_id
  base = TrainConfig()
  moved = TrainConfig(trainer=TrainerConfig(runs_dir="/elsewhere", steps=7, log_every=3, eval_every=2),
                      task=TrmSudokuConfig(data=SudokuData(cache_dir="/c", eval_batch_size=100),
                                           bar_metrics=("loss",)))
  assert run_id(base, "trm") == run_id(moved, "trm") == run_id(TrainConfig(), "trm")
  assert run_id(base, "trm") != run_id(TrainConfig(task=TrmSudokuConfig(data=SudokuData(seed=1))), "trm")
  assert run_id(TrainConfig(trainer=TrainerConfig(steps=100)), "x") != run_id(
      TrainConfig(task=CausalLMConfig(), trainer=TrainerConfig(steps=100)), "x")


def test_a_nested_tuple_field_takes_a_comma_list():
  """`--task.lora.target_modules q_proj,v_proj` (a tuple inside a choice section) parses as a list, as the
  top-level `--layers 4,8` does, not as a string split into characters."""
  from jaxpod.cli.args import parse
  from jaxpod.train.config import TrainConfig
  cfg = parse(TrainConfig, ["--task.type", "causal_lm", "--task.lora.rank", "4", "--task.lora.target_modules",
                            "q_proj,v_proj"], "jaxpod train")
  assert cfg.task.lora.target_modules == ("q_proj", "v_proj")
