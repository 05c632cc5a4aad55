"""Key/value caches the decoder reads and writes: static (`KVCache`), paged (`PagedKVCache`), per slot (`SlotKVCache`).

Shapes use B=rows, T=new tokens, S=key slots, K=kv heads, E=head_dim, L=layers, P=pages.

  KVCache      [L, B, K, S, E] each for k and v, plus each slot's position [B, S]; the lock-step
               engine writes the T new tokens at one shared slot index (`Attention` updates it in place).
  PagedKVCache pools [L, N, P, page_size, K, E] plus a page table [B, M]: N data shards (the
               mesh's data-parallel size), each holding P pages for its own block of B/N rows
               (rows split like the batch); position p of row b lives in page table[b, p // page_size]
               of b's shard at offset p % page_size. Reading gathers a row's pages within its
               shard (no data-parallel communication). Page 0 of each shard is scratch.
  SlotKVCache  one [B, K, S, E] buffer per layer (a tuple of L), S the current capacity: row b
               is decode slot b, position p at index p. A layer's buffer is read whole, in place
               (a slice or a gather would be copied before the attention matmul), so the engine
               keeps S at the smallest bucket its live rows need.

The paged and slot caches never write during the forward: each layer *stages* its new keys
and values and the caller writes them all at once (`write`) where no later read of the
buffers follows in its program (a scatter into a buffer that later ops still read made XLA
copy the whole buffer).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxpod.models.llama.config import LlamaConfig
from jaxpod.runtime.sharding import constrain

CACHE_AXES = ("layers", "batch", "kv_heads", "cache_seq", "head_dim")
PAGE_AXES = ("layers", "batch", None, None, "kv_heads", "head_dim")  # [L, N, P, ps, K, E]: a pool per data shard
SLOT_AXES = ("batch", "kv_heads", "cache_seq", "head_dim")  # one layer's buffer: slots split like decode rows


class KVCache(NamedTuple):
  """Static key/value cache, each [L, B, K, S, E] (the layout attention reads without a transpose), and the
  position of the token in each slot [B, S] (slots are not positions here; sliding layers mask on positions)."""

  k: jax.Array
  v: jax.Array
  pos: jax.Array

  @classmethod
  def zeros(cls, cfg: LlamaConfig, batch: int, length: int) -> "KVCache":
    shape = (cfg.num_hidden_layers, batch, cfg.num_key_value_heads, length, cfg.head_dim_)
    z = jnp.zeros(shape, cfg.jnp_dtype)
    return cls(constrain(z, CACHE_AXES), constrain(z, CACHE_AXES),
               constrain(jnp.zeros((batch, length), jnp.int32), ("batch", "cache_seq")))

  @staticmethod
  def nbytes(cfg: LlamaConfig, batch: int, length: int) -> int:
    """Bytes of a cache of this size (k and v)."""
    n = cfg.num_hidden_layers * batch * length * cfg.num_key_value_heads * cfg.head_dim_
    return 2 * n * jnp.dtype(cfg.jnp_dtype).itemsize


class PagedKVCache(NamedTuple):
  """Key/value page pools, each [L, N, P, page_size, K, E] (N data shards of P pages), and the page table [B, M]
  of the rows in this call: the rows split in N equal blocks like the batch, and the entries of block n are
  page numbers in shard n (page 0 of every shard is its scratch page)."""

  k: jax.Array
  v: jax.Array
  table_BxM: jax.Array
  staged_k: tuple = ()  # per layer so far: new keys [B, T, K, E]
  staged_v: tuple = ()

  @classmethod
  def zeros(cls, cfg: LlamaConfig, num_pages: int, page_size: int, table_BxM, shards: int = 1) -> "PagedKVCache":
    shape = (cfg.num_hidden_layers, shards, num_pages, page_size, cfg.num_key_value_heads, cfg.head_dim_)
    z = constrain(jnp.zeros(shape, cfg.jnp_dtype), PAGE_AXES)
    return cls(z, z, table_BxM)

  @staticmethod
  def page_bytes(cfg: LlamaConfig, page_size: int) -> int:
    """Bytes of one page (k and v, all layers)."""
    n = cfg.num_hidden_layers * page_size * cfg.num_key_value_heads * cfg.head_dim_
    return 2 * n * jnp.dtype(cfg.jnp_dtype).itemsize

  @property
  def shards(self) -> int:
    """N: data shards, each with its own pages and its own block of rows."""
    return self.k.shape[1]

  def _blocks(self, x_Bx, axis: int = 0):
    """x with its row axis [B] split into [N, B/N] (each shard's rows)."""
    n = self.shards
    return x_Bx.reshape(*x_Bx.shape[:axis], n, x_Bx.shape[axis] // n, *x_Bx.shape[axis + 1:])

  def stage(self, k_BxTxKxE, v_BxTxKxE) -> "PagedKVCache":
    """Keep this layer's new keys/values for `write`."""
    return self._replace(staged_k=self.staged_k + (k_BxTxKxE.astype(self.k.dtype),),
                         staged_v=self.staged_v + (v_BxTxKxE.astype(self.v.dtype),))

  def slots(self, positions_BxT):
    """(page in the row's shard, offset) of each position, each [B, T]."""
    ps = self.k.shape[3]
    return jnp.take_along_axis(self.table_BxM, positions_BxT // ps, axis=1, mode="clip"), positions_BxT % ps

  def staged(self):
    """Staged keys and values, each [L, B, T, K, E]."""
    return jnp.stack(self.staged_k), jnp.stack(self.staged_v)

  def pending(self, positions_BxT):
    """What `write` needs to store the staged keys/values at these positions."""
    return (*self.slots(positions_BxT), *self.staged())

  def nothing(self, rows: int):
    """A `pending` that writes nothing that matters (zeros into the scratch pages)."""
    l, kh, e = self.k.shape[0], self.k.shape[4], self.k.shape[5]
    zeros_i = jnp.zeros((rows, 1), jnp.int32)
    return zeros_i, zeros_i, jnp.zeros((l, rows, 1, kh, e), self.k.dtype), jnp.zeros((l, rows, 1, kh, e), self.v.dtype)

  def write(self, pending) -> "PagedKVCache":
    """Pools with every layer's keys/values stored at (page, offset) in each row's shard; one scatter per pool
    (batched over the shards: each writes its own rows into its own pages); nothing staged."""
    page_BxT, off_BxT, k_LxBxTxKxE, v_LxBxTxKxE = pending
    page, off = self._blocks(page_BxT), self._blocks(off_BxT)

    def put(pool, x_LxBxTxKxE):
      if self.shards == 1:  # one pool: a plain scatter (the vmapped form made a one-shard paged rollout ~20% slower)
        return pool.at[:, 0, page_BxT, off_BxT].set(x_LxBxTxKxE)
      one = lambda pool_s, page_s, off_s, x_s: pool_s.at[:, page_s, off_s].set(x_s)  # noqa: E731
      return jax.vmap(one, in_axes=(1, 0, 0, 1), out_axes=1)(pool, page, off, self._blocks(x_LxBxTxKxE, 1))
    return PagedKVCache(put(self.k, k_LxBxTxKxE), put(self.v, v_LxBxTxKxE), self.table_BxM)

  def copy_pages(self, src_D, dst_D) -> "PagedKVCache":
    """Pools with page src_D[d] copied onto page dst_D[d] in shard d // (D / N) (pad entries: scratch onto
    scratch)."""
    src, dst = self._blocks(src_D), self._blocks(dst_D)

    def copy(pool):
      if self.shards == 1:
        return pool.at[:, 0, dst_D].set(pool[:, 0, src_D])
      one = lambda pool_s, src_s, dst_s: pool_s.at[:, dst_s].set(pool_s[:, src_s])  # noqa: E731
      return jax.vmap(one, in_axes=(1, 0, 0), out_axes=1)(pool, src, dst)
    return self._replace(k=copy(self.k), v=copy(self.v))

  def for_rows(self, live_B) -> "PagedKVCache":
    """Rows that are not live read and write their shard's scratch page only."""
    return self._replace(table_BxM=jnp.where(live_B[:, None], self.table_BxM, 0))

  def read(self, layer: int, kv_len: int):
    """Keys and values of slots 0..kv_len-1 (kv_len a multiple of page_size), each [B, K, S, E]; each shard gathers
    its rows' pages from its own pool."""
    b, ps = self.table_BxM.shape[0], self.k.shape[3]
    pages = self._blocks(self.table_BxM[:, :kv_len // ps])  # [N, B/N, M']

    def gather(pool):  # [N, B/N, M', ps, K, E] -> [B, K, S, E]
      x = (pool[layer, 0][pages] if self.shards == 1  # [1, B, M', ps, K, E]
           else jax.vmap(lambda pool_s, pages_s: pool_s[pages_s])(pool[layer], pages))
      return x.reshape(b, kv_len, *x.shape[4:]).transpose(0, 2, 1, 3)
    return gather(self.k), gather(self.v)


class SlotKVCache(NamedTuple):
  """One key and one value buffer per layer, each [B, K, S, E]: row b is decode slot b, S the capacity."""

  k: tuple
  v: tuple
  staged_k: tuple = ()  # per layer so far: new keys [B, T, K, E]
  staged_v: tuple = ()

  @classmethod
  def zeros(cls, cfg: LlamaConfig, slots: int, capacity: int) -> "SlotKVCache":
    shape = (slots, cfg.num_key_value_heads, capacity, cfg.head_dim_)
    z = lambda: constrain(jnp.zeros(shape, cfg.jnp_dtype), SLOT_AXES)  # noqa: E731
    return cls(tuple(z() for _ in range(cfg.num_hidden_layers)), tuple(z() for _ in range(cfg.num_hidden_layers)))

  @property
  def capacity(self) -> int:
    return self.k[0].shape[2]

  def stage(self, k_BxTxKxE, v_BxTxKxE) -> "SlotKVCache":
    """Keep this layer's new keys/values for `write`."""
    dtype = self.k[0].dtype if self.k else k_BxTxKxE.dtype  # a staging-only cache (prefill) has no buffers
    return self._replace(staged_k=self.staged_k + (k_BxTxKxE.astype(dtype),),
                         staged_v=self.staged_v + (v_BxTxKxE.astype(dtype),))

  def pending(self, positions_BxT):
    """What `write` needs to store one new token per row (T = 1) at its position."""
    rows_B = jnp.arange(positions_BxT.shape[0])
    return rows_B, positions_BxT[:, 0], tuple(k[:, 0] for k in self.staged_k), tuple(v[:, 0] for v in self.staged_v)

  def nothing(self, rows: int):
    """A `pending` that writes nothing (its row indices are out of range, so the scatter drops them)."""
    kh, e = self.k[0].shape[1], self.k[0].shape[3]
    zeros = tuple(jnp.zeros((rows, kh, e), x.dtype) for x in self.k)
    return jnp.full((rows,), self.k[0].shape[0], jnp.int32), jnp.zeros((rows,), jnp.int32), zeros, zeros

  def write(self, pending) -> "SlotKVCache":
    """Buffers with key/value [B, K, E] of layer l stored at (row, position); one scatter per buffer."""
    rows_B, pos_B, k_B, v_B = pending
    put = lambda buf, x: buf.at[rows_B, :, pos_B].set(x, mode="drop")  # noqa: E731
    return SlotKVCache(tuple(map(put, self.k, k_B)), tuple(map(put, self.v, v_B)))

  def for_rows(self, live_B) -> "SlotKVCache":
    """Every row reads its own buffer row; rows that are not live are ignored by the caller."""
    del live_B
    return self

  def read(self, layer: int, kv_len: int | None = None):
    """Keys and values of layer `layer`, each [B, K, S, E], in place (the whole capacity)."""
    del kv_len
    return self.k[layer], self.v[layer]
