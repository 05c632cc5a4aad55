"""The extraction loop: the same forward on every host, per-host shards, global resume.

    stats = run(ExtractConfig(hf=..., prompts=..., layers=(4, 8), out="gs://..."))

1. Checks before JAX init (config.check_inputs), then `runtime.init`.
2. The leader reads and tokenizes the prompts, decides the padded length, checks or writes
   `run.json`, writes the token ids to `prompt_tokens-<run id>.npz` in the output folder and
   broadcasts its name and sha256 (invariant 1: nothing per host; invariant 2: the ids, however
   many prompts, travel through storage, not through the coordination service).
3. Every host reads its progress record; all resume from the minimum (invariant 5).
4. Per batch: a named barrier (a failed peer is noticed before the next collective), the
   forward on every host, this host's replica-0 rows to its shard file, then its progress
   record (invariant 4). A failure anywhere is published and names its host (invariant 3).
5. The leader writes `manifest.json`.

Two forwards (`ExtractConfig.forward`). `sharded` (default; extract/sharded.py): the model's
own forward at full batch with weights left sharded (fsdp/model), so models larger than one
device fit and the forward stays GEMM-bound; the same bytes on a fixed mesh (rerun, resume),
values within `sharded.TOLERANCE` across meshes. `exact` (extract/forward.py): each row
alone with whole weights inside a `shard_map`, so the same bytes on any mesh, for models that
fit one device. Before compiling, the leader checks the memory plan (extract/memory.py).
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import time
from typing import Callable

import numpy as np

from jaxpod import runtime
from jaxpod.extract import writer
from jaxpod.extract.config import ExtractConfig, check_batch, check_inputs, read_prompts
from jaxpod.runtime.log import get_logger

log = get_logger("extract")
BARRIER_TIMEOUT_S = 600.0


@dataclasses.dataclass
class Plan:
  """What every host needs to run the same batches: decided on the leader, broadcast."""

  run_id: str  # hash of model config, token ids, layers, points, dtype, batch, length, layout
  seq_len: int  # padded length T of every batch
  lengths: np.ndarray  # [N] real tokens per prompt
  tokens: np.ndarray  # [N, T] int32, right-padded with pad_id
  start_batch: int = 0  # first batch to run (after the resume agreement)

  @property
  def num_rows(self) -> int:
    return len(self.lengths)

  def num_batches(self, batch_size: int) -> int:
    return -(-self.num_rows // batch_size)

  def batch(self, b: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Model input of global batch b: (tokens [B, T] int32, mask [B, T] bool).

    Padding (and rows past the end) feed token 0: masked out as keys, and always a valid
    embedding row even when the tokenizer's pad id is not.
    """
    lens = np.zeros((batch_size,), np.int32)
    rows = self.tokens[b * batch_size:(b + 1) * batch_size]
    lens[:len(rows)] = self.lengths[b * batch_size:(b + 1) * batch_size]
    mask = np.arange(self.seq_len)[None, :] < lens[:, None]
    tok = np.zeros((batch_size, self.seq_len), np.int32)
    tok[:len(rows)] = rows
    return np.where(mask, tok, 0), mask


def _tokenize(cfg: ExtractConfig) -> tuple[np.ndarray, np.ndarray, int]:
  """(flat ids, lengths, pad id) of the prompt file, truncated to max_seq_len; leader only."""
  from jaxpod.models.llama import load_tokenizer
  prompts = read_prompts(cfg.prompts)
  if not prompts:
    raise ValueError(f"extract.prompts={cfg.prompts!r} holds no prompts; give one per line (.txt) or .jsonl")
  tok = load_tokenizer(cfg.hf)
  ids = [tok.encode(p)[:cfg.max_seq_len] for p in prompts]
  lengths = np.asarray([len(i) for i in ids], np.int32)
  flat = np.asarray([t for i in ids for t in i], np.int32)
  return flat, lengths, int(tok.pad_id)


def layout(cfg: ExtractConfig, num_devices: int) -> dict:
  """Hosts and resolved mesh sizes: shard files are named per host, so a resume needs the same."""
  data, fsdp, model = cfg.mesh.resolve(num_devices)
  return {"hosts": runtime.host_info().process_count, "mesh": {"data": data, "fsdp": fsdp, "model": model}}


def run_record(cfg: ExtractConfig, hf: dict, plan_fields: dict, lay: dict) -> dict:
  """Contents of run.json (and the base of manifest.json)."""
  hidden = int(hf["hidden_size"])
  n, t = plan_fields["num_rows"], plan_fields["seq_len"]
  return {
      "format": writer.FORMAT, "model": cfg.hf, "model_config": hf, "layers": sorted(cfg.layers),
      "points": list(cfg.points), "keys": list(cfg.keys), "dtype": cfg.np_dtype, "batch_size": cfg.batch_size,
      "max_seq_len": cfg.max_seq_len, "seq_len": t, "hidden_size": hidden, "num_rows": n,
      "num_batches": -(-n // cfg.batch_size), "shapes": {k: [n, t, hidden] for k in cfg.keys},
      "forward": cfg.forward, "run_id": plan_fields["run_id"], **lay,
      **({"adapter": cfg.adapter} if cfg.adapter else {}),
  }


def _plan_on_leader(cfg: ExtractConfig, hf: dict, lay: dict, storage: writer.Storage, mesh, model_cfg) -> dict:
  """Tokenize, fix the padded length and run id, check the memory plan, check or write run.json; the broadcast
  payload."""
  from jaxpod.extract import memory
  flat, lengths, pad = _tokenize(cfg)
  seq_len = int(lengths.max())
  memory.check_memory(model_cfg, cfg, mesh, seq_len)  # before any weight is read or compiled
  digest = hashlib.sha256()
  parts = (json.dumps(hf, sort_keys=True), cfg.hf, sorted(cfg.layers), cfg.points, cfg.np_dtype, cfg.batch_size,
           seq_len, pad, json.dumps(lay, sort_keys=True), cfg.forward)
  for part in parts + ((cfg.adapter,) if cfg.adapter else ()):  # no adapter: the run id of before adapters existed
    digest.update(repr(part).encode())
  digest.update(lengths.tobytes())
  digest.update(flat.tobytes())
  fields = {"run_id": digest.hexdigest()[:16], "num_rows": len(lengths), "seq_len": seq_len}
  record = run_record(cfg, hf, fields, lay)
  old = storage.read_json(storage.path("run.json"))
  if old is not None and old.get("run_id") != record["run_id"]:
    differ = [k for k in ("model", "adapter", "layers", "points", "dtype", "batch_size", "seq_len", "num_rows", "hosts",
                          "mesh", "forward")
              if old.get(k) != record.get(k)] or ["model weights config or prompt tokens"]
    raise ValueError(f"extract.out={cfg.out!r} holds another extraction (differs in {', '.join(differ)}); "
                     "rerun with the same options and hosts to resume, or use a new --out")
  if old is None:
    storage.write_json(storage.path("run.json"), record)
  storage.remove_temporaries()  # no host writes before this broadcast returns
  buf = io.BytesIO()
  np.savez(buf, lengths=lengths, flat=flat)
  name = f"prompt_tokens-{fields['run_id']}.npz"
  storage.write_atomic(storage.path(name), buf.getvalue())
  return {**fields, "pad": pad, "tokens_file": name, "sha256": hashlib.sha256(buf.getvalue()).hexdigest()}


def _make_plan(payload: dict, storage: writer.Storage) -> Plan:
  """Every host: the prompt token ids from the file the leader wrote (checked against its sha256)."""
  blob = storage.read_bytes(storage.path(payload["tokens_file"]))
  if blob is None or hashlib.sha256(blob).hexdigest() != payload["sha256"]:
    raise ValueError(f"{storage.path(payload['tokens_file'])} is missing or differs from what the leader wrote; "
                     "is --out shared storage every host sees (a bucket URL)?")
  arrays = np.load(io.BytesIO(blob), allow_pickle=False)
  lengths, flat, t = arrays["lengths"], arrays["flat"], payload["seq_len"]
  tokens = np.full((len(lengths), t), payload["pad"], np.int32)
  mask = np.arange(t)[None, :] < lengths[:, None]
  tokens[mask] = flat  # row-major order of the mask = prompt order, then token order
  return Plan(payload["run_id"], t, lengths, tokens)


def _resume(storage: writer.Storage, plan: Plan, num_batches: int) -> int:
  """Every host's committed batch count -> the minimum, agreed by all hosts."""
  host = runtime.host_info().process_index
  mine = min(writer.committed(storage, host, plan.run_id), num_batches)
  every = runtime.allgather(mine, "extract.resume")
  start = min(every)
  if start:
    log.info("resuming at batch %d of %d (committed per host: %s)", start, num_batches, every)
  return start


class _Timer:
  """Seconds spent per phase (setup, barrier, forward, pull, write): totals and per batch."""

  def __init__(self):
    self.seconds: dict[str, float] = {}
    self.batches: list[dict[str, float]] = []  # one dict per batch run

  def add(self, name: str, since: float, batch: bool = False) -> float:
    now = time.perf_counter()
    self.seconds[name] = self.seconds.get(name, 0.0) + now - since
    if batch:
      self.batches[-1][name] = self.batches[-1].get(name, 0.0) + now - since
    return now


class _Committer:
  """Writes one batch at a time (its shard file, then its progress record) in a background
  thread, so the write of batch b overlaps the forward of b+1. `wait()` returns the batch
  in flight once committed, or raises its error."""

  def __init__(self, storage: writer.Storage, host: int, run_id: str):
    from concurrent.futures import ThreadPoolExecutor
    self.storage, self.host, self.run_id = storage, host, run_id
    self._pool = ThreadPoolExecutor(1, thread_name_prefix="jaxpod-extract-write")
    self._pending = None
    self.busy_s = 0.0  # time the thread spent writing (hidden behind the forward when it overlaps)

  def submit(self, b: int, tensors: dict[str, np.ndarray]) -> None:
    self._pending = (b, self._pool.submit(self._write, b, tensors))

  def _write(self, b: int, tensors: dict[str, np.ndarray]) -> None:
    t = time.perf_counter()
    if len(tensors["row_ids"]):
      writer.write_shard(self.storage, b, self.host, tensors, {"run": self.run_id})
    writer.commit(self.storage, self.host, self.run_id, b + 1)
    self.busy_s += time.perf_counter() - t

  def wait(self) -> int | None:
    if self._pending is None:
      return None
    (b, future), self._pending = self._pending, None
    future.result()
    return b

  def close(self) -> None:
    self._pool.shutdown(wait=True)


def run(cfg: ExtractConfig, runtime_cfg: runtime.RuntimeConfig | None = None,
        on_batch: Callable[[int], None] | None = None) -> dict:
  """Extract activations to cfg.out on every host of the job; returns timing and counts."""
  runtime_cfg = runtime_cfg or runtime.RuntimeConfig()
  hf = check_inputs(cfg, runtime_cfg.hosts())  # invariant 7: before JAX init
  host = runtime.init(runtime_cfg)
  with runtime.guard():
    return _run(cfg, hf, host, on_batch)


def _run(cfg: ExtractConfig, hf: dict, host: runtime.HostInfo, on_batch) -> dict:
  import jax
  from jaxpod.extract import forward as fwd_lib, sharded as sharded_lib
  from jaxpod.extract.progress import Progress
  from jaxpod.models.llama import LlamaConfig, hf_io
  timer, t0 = _Timer(), time.perf_counter()
  model_cfg = LlamaConfig.from_hf_config(hf)  # the config.json check_inputs already read: no second read
  check_batch(cfg, jax.device_count())
  storage = writer.Storage(cfg.out)
  lay = layout(cfg, jax.device_count())
  mesh = runtime.make_mesh(**lay["mesh"])
  payload = runtime.broadcast_call(lambda: _plan_on_leader(cfg, hf, lay, storage, mesh, model_cfg), "extract.plan")
  plan = _make_plan(payload, storage)
  nb = plan.num_batches(cfg.batch_size)
  plan.start_batch = _resume(storage, plan, nb)
  with jax.set_mesh(mesh):
    model = hf_io.load(cfg.hf, mesh, cfg=model_cfg)
    if cfg.adapter:  # LoRA: the adapters loaded as `jaxpod sample --adapter` does, then folded into the base
      from jaxpod.models.llama import lora, peft_io
      lora.merge_in_place(peft_io.load_adapter(model, cfg.adapter, mesh=mesh))
    if cfg.forward == "sharded":  # the model's stacked blocks, one gathered per loop iteration
      forward = sharded_lib.ShardedForward(model, mesh, cfg)
    else:
      forward = fwd_lib.Forward(model, mesh, cfg)
    del model
    t = timer.add("setup", t0)
    bar = Progress(plan, cfg, enabled=cfg.progress and host.is_leader)
    committer = _Committer(storage, host.process_index, plan.run_id)
    try:
      t = _loop(plan, cfg, forward, committer, timer, bar, on_batch, t)
    finally:
      committer.close()
      bar.close()
  runtime.barrier("extract.done", BARRIER_TIMEOUT_S)
  t = timer.add("barrier", t)
  if host.is_leader:
    _write_manifest(storage, cfg, hf, plan, lay)
  runtime.barrier("extract.manifest", BARRIER_TIMEOUT_S)
  timer.add("write", t)
  done = range(plan.start_batch, nb)
  rows = sum(min(cfg.batch_size, plan.num_rows - b * cfg.batch_size) for b in done)
  tokens = int(sum(plan.lengths[b * cfg.batch_size:(b + 1) * cfg.batch_size].sum() for b in done))
  return {"batches": len(done), "start_batch": plan.start_batch, "rows": rows, "tokens": tokens,
          "mesh": lay["mesh"], "seconds": timer.seconds, "batch_seconds": timer.batches,
          "write_busy_s": committer.busy_s,
          "run_id": plan.run_id}


def _loop(plan: Plan, cfg: ExtractConfig, forward, committer: _Committer, timer: _Timer, bar, on_batch,
          t: float) -> float:
  """The batches. Per batch b: barrier, forward b (while batch b-1 is written in the background),
  wait for b-1's commit, pull b's replica-0 rows, hand them to the writer. A write error
  surfaces only after this host has finished forward b, so no peer is left in a collective."""
  import jax

  def committed(b):
    if b is not None:
      if on_batch is not None:
        on_batch(b)
      bar.advance(b)

  for b in range(plan.start_batch, plan.num_batches(cfg.batch_size)):
    timer.batches.append({})
    runtime.barrier("extract.batch", BARRIER_TIMEOUT_S)
    t = timer.add("barrier", t, batch=True)
    captures = forward(*plan.batch(b, cfg.batch_size))
    jax.block_until_ready(captures)
    t = timer.add("forward", t, batch=True)
    committed(committer.wait())
    t = timer.add("write", t, batch=True)
    tensors = _host_tensors(captures, plan, b, cfg.batch_size)
    t = timer.add("pull", t, batch=True)
    committer.submit(b, tensors)
  committed(committer.wait())
  return timer.add("write", t, batch=bool(timer.batches))


def _host_tensors(captures: dict, plan: Plan, b: int, batch_size: int) -> dict[str, np.ndarray]:
  """This host's rows of batch b (real prompts only): row ids, tokens, mask, activations."""
  out, rows = {}, None
  for key, arr in captures.items():
    r, values = writer.replica0_rows(arr)
    if rows is not None and not np.array_equal(r, rows):
      raise RuntimeError(f"capture {key} is laid out differently from the others on this host")
    rows = r
    out[key] = values
  keep = rows + b * batch_size < plan.num_rows
  rows = rows[keep] + b * batch_size
  out = {k: v[keep] for k, v in out.items()}
  out["row_ids"] = rows
  out["tokens"] = plan.tokens[rows]
  out["mask"] = (np.arange(plan.seq_len)[None, :] < plan.lengths[rows][:, None]).astype(np.uint8)
  return out


def _write_manifest(storage: writer.Storage, cfg: ExtractConfig, hf: dict, plan: Plan, lay: dict) -> None:
  fields = {"run_id": plan.run_id, "num_rows": plan.num_rows, "seq_len": plan.seq_len}
  manifest = run_record(cfg, hf, fields, lay)
  manifest["counts"] = {"rows": plan.num_rows, "tokens": int(plan.lengths.sum()),
                        "batches": plan.num_batches(cfg.batch_size), "shard_files": len(storage.list_shards())}
  manifest["complete"] = True
  storage.write_json(storage.path("manifest.json"), manifest)
