"""HostInfo from each source, known before JAX initialises."""
import pytest

from jaxpod.runtime.hosts import HostInfo, detect_hosts, validate_divisible

LAUNCH = {"JAXPOD_COORDINATOR": "127.0.0.1:1234", "JAXPOD_NUM_PROCESSES": "4", "JAXPOD_PROCESS_ID": "2",
          "JAXPOD_DEVICES_PER_HOST": "2"}


@pytest.fixture
def clean_env(monkeypatch):
  import os
  for k in list(os.environ):
    if k.startswith(("JAXPOD_", "SLURM_", "OMPI_", "TPU_", "KUBERNETES_")):
      monkeypatch.delenv(k)
  return monkeypatch


def test_explicit_config_wins_over_everything(clean_env):
  h = detect_hosts(process_id=1, num_processes=2, coordinator="10.0.0.1:99", env=LAUNCH)
  assert (h.process_index, h.process_count, h.source, h.is_leader) == (1, 2, "config", False)


def test_launcher_variables(clean_env):
  h = detect_hosts(env=LAUNCH)
  assert h == HostInfo(2, 4, "127.0.0.1:1234", 2, "jaxpod-launch", True)
  assert h.label() == "host 2/4"


def test_incomplete_launcher_variables_say_which_are_missing(clean_env):
  env = {"JAXPOD_PROCESS_ID": "0"}
  with pytest.raises(ValueError, match="JAXPOD_COORDINATOR, JAXPOD_NUM_PROCESSES missing"):
    detect_hosts(env=env)


def test_garbage_launcher_variable_is_named(clean_env):
  with pytest.raises(ValueError, match=r"JAXPOD_PROCESS_ID='two' is not an integer"):
    detect_hosts(env=dict(LAUNCH, JAXPOD_PROCESS_ID="two"))


def test_index_out_of_range_is_named(clean_env):
  with pytest.raises(ValueError, match=r"process_index must be in \[0, 4\), got 4"):
    detect_hosts(env=dict(LAUNCH, JAXPOD_PROCESS_ID="4"))


def test_fake_slurm_environment_is_detected_through_jax(clean_env):
  """A faked SLURM environment (no real SLURM here): JAX's own detector reads it."""
  for k, v in {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[001-004]", "SLURM_NTASKS": "4",
               "SLURM_PROCID": "3", "SLURM_LOCALID": "0"}.items():
    clean_env.setenv(k, v)
  h = detect_hosts()
  assert (h.process_index, h.process_count, h.source) == (3, 4, "slurm")


def test_fake_open_mpi_environment_is_detected_through_jax(clean_env):
  """A faked Open MPI environment (no mpirun here)."""
  for k, v in {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.0.0.1:34911", "OMPI_COMM_WORLD_SIZE": "2",
               "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}.items():
    clean_env.setenv(k, v)
  h = detect_hosts()
  assert (h.process_index, h.process_count, h.source) == (1, 2, "ompi")


def test_unreadable_cluster_variables_are_one_clear_error(clean_env):
  for k, v in {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "n1", "SLURM_NTASKS": "four", "SLURM_PROCID": "0",
               "SLURM_LOCALID": "0"}.items():
    clean_env.setenv(k, v)
  with pytest.raises(ValueError, match="SlurmCluster environment detected but unreadable"):
    detect_hosts()


def test_no_cluster_means_one_process(clean_env):
  h = detect_hosts()
  assert (h.process_index, h.process_count, h.source, h.is_leader) == (0, 1, "single", True)


def test_divisibility_is_checked_before_init():
  h = HostInfo(0, 3, "x:1", None, "config")
  with pytest.raises(ValueError, match="global_batch_size=32 is not divisible by the 3 hosts; use a multiple of 3"):
    validate_divisible("global_batch_size", 32, h)
