"""jaxpod.models.llama: a Llama-family decoder (NNX), HF checkpoint I/O and tokenizers.

    cfg = hf_io.load_config(folder)                 # or LlamaConfig(...), tiny(...)
    model = hf_io.load(folder, mesh)                 # parameters placed in their shardings
    graphdef, params = nnx.split(model)
    out = forward(graphdef, params, tokens_BxT, capture_layers=(3,), capture_points=("resid",))
    out.logits  # [B, T, V] float32;  out.captures["resid.3"]  # [B, T, D]
"""
from jaxpod.models.llama.config import LlamaConfig, tiny
from jaxpod.models.llama.model import (CAPTURE_POINTS, KVCache, Llama, Output, PagedKVCache, SlotKVCache, abstract,
                                      forward, init)
from jaxpod.models.llama.tokenizer import ByteTokenizer, Tokenizer, load_tokenizer
from jaxpod.models.llama import hf_io
