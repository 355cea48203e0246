"""The grouped-GEMM calls of one MoE layer's forward and backward, from a Hugging Face model config.

Field names read (the first present of each; Mixtral, DeepSeek-V3, Qwen3-MoE and gpt-oss configs all work):
  experts: num_local_experts (Mixtral, gpt-oss), n_routed_experts (DeepSeek-V3), num_experts (Qwen3-MoE);
  top_k: num_experts_per_tok (experts_per_token in gpt-oss's original config);
  hidden: hidden_size;
  intermediate (one expert's FFN width): moe_intermediate_size (DeepSeek-V3, Qwen3-MoE), else intermediate_size.
A nested "text_config" (multimodal checkpoints) is read where the top level has no experts field.

The layer (per device, expert parallelism over `ep` devices, balanced routing): T tokens choose top_k experts
each; after the all-to-all a device holds M = T * top_k rows for its G = experts / ep experts (M / G rows per
expert). Calls, with H = hidden and I = intermediate:
  forward:  gmm (M, H) x (G, H, 2I) with activation swiglu -> (M, I); gmm (M, I) x (G, I, H) -> (M, H);
  backward: d lhs of each: gmm_t (the rhs read transposed: K = 2I, N = H and K = H, N = I);
            d rhs of each: tgmm with lhs transposed (K = H, N = 2I and K = I, N = H);
  masked (the decode layout, G x ceil(M / G) rows): masked (K = H, N = 2I), (K = I, N = H), and their d x
            (K = 2I, N = H), (K = H, N = I), with transpose (masked_gmm_kn: the weights (G, N, K) read in place as
            (G, K', N'), as the backward's key records it).
In FP8 (fp8_recipes; FP8 inputs, outputs in the layer's dtype), per scale recipe: the forward products as FP8 gmms
of K-major weights (G, N, K), as jgmm.fp8_gmm quantises them: gmm_t_fp8 (K = H, N = 2I), (K = I, N = H), and the
masked layout's masked_fp8 (the same K and N; FP8 masked_gmm has no backward). With jgmm.fp8_gmm's own recipe
(FP8_GMM_RECIPE) also its backward: d lhs gmm_t_fp8 (K = 2I, N = H), (K = H, N = I), and d rhs tgmm_fp8 of lhs^T
(K, M) and dout^T (N, M), scales per 128 rows of M (K = H, N = 2I), (K = I, N = H); its gate-up forward writes
float32, as jgmm.moe.expert_mlp(impl="fp8") asks for it (the activation's input).
"""
from collections.abc import Sequence
from typing import NamedTuple

from jgmm import config_table


FP8_GMM_RECIPE = "1x128-128x128"  # jgmm.fp8_gmm's scales (DeepSeek-V3's): activations 1x128, weights 128x128.


class MoeDims(NamedTuple):
  experts: int
  top_k: int
  hidden: int
  intermediate: int


_FIELDS = {"experts": ("num_local_experts", "n_routed_experts", "num_experts"),
           "top_k": ("num_experts_per_tok", "experts_per_token"),
           "hidden": ("hidden_size",),
           "intermediate": ("moe_intermediate_size", "intermediate_size")}


def moe_dims(config: dict, name: str = "config") -> MoeDims:
  """MoeDims of a Hugging Face config (a dict); ValueError naming the fields missing from `name`."""
  if not any(f in config for f in _FIELDS["experts"]) and isinstance(config.get("text_config"), dict):
    config = config["text_config"]
  dims = {}
  for dim, fields in _FIELDS.items():
    value = next((config[f] for f in fields if config.get(f) is not None), None)
    if type(value) is not int or value < 1:
      raise ValueError(f"{name}: needs a positive int in one of {fields} (the MoE layer's {dim}), got "
                       f"{ {f: config.get(f) for f in fields} }")
    dims[dim] = value
  return MoeDims(**dims)


def layer_calls(dims: MoeDims, ep: int, tokens, dtype: str = "bfloat16", fp8_recipes: Sequence[str] = (),
                fp8_dtype: str = "float8_e4m3fn") -> list[tuple[config_table.Key, int]]:
  """[(Key, M)] of every distinct call (module docstring) at each token count in `tokens`, M the call's total rows
  (masked: G * rows per group). dtype: the numpy name of the inputs' and outputs' dtype; fp8_recipes: names of
  config_table.FP8_RECIPES whose FP8 calls to add too, with fp8_dtype (a numpy name) inputs."""
  if ep < 1 or dims.experts % ep:
    raise ValueError(f"--ep must divide the {dims.experts} experts, got {ep}")
  g = dims.experts // ep
  h, i = dims.hidden, dims.intermediate
  calls = {}
  for t in tokens:
    m = t * dims.top_k
    rows = -(-m // g)
    key = lambda op, k, n, **flags: config_table.make_key(op, dtype, dtype, m / g, k, n, g, **flags)
    masked = lambda k, n, **flags: config_table.make_key("masked", dtype, dtype, rows, k, n, g, **flags)
    for k_n, mm in [(key("gmm", h, 2 * i, activation="swiglu"), m), (key("gmm", i, h), m),
                    (key("gmm_t", 2 * i, h, transpose=True), m), (key("gmm_t", h, i, transpose=True), m),
                    (key("tgmm", h, 2 * i, transpose=True), m), (key("tgmm", i, h, transpose=True), m),
                    (masked(h, 2 * i), g * rows), (masked(i, h), g * rows),
                    (masked(2 * i, h, transpose=True), g * rows), (masked(h, i, transpose=True), g * rows)]:
      calls.setdefault(k_n, mm)
    for recipe in fp8_recipes:
      def fp8(op, k, n, out=dtype, rows=m / g, scale=recipe):
        return config_table.make_key(op, fp8_dtype, out, rows, k, n, g, transpose=op == "gmm_t_fp8", scale=scale)
      gate_up_out = "float32" if recipe == FP8_GMM_RECIPE else dtype  # jgmm.moe's FP8 MLP: the activation's input
      fp8_calls = [(fp8("gmm_t_fp8", h, 2 * i, gate_up_out), m), (fp8("gmm_t_fp8", i, h), m),
                   (fp8("masked_fp8", h, 2 * i, rows=rows), g * rows), (fp8("masked_fp8", i, h, rows=rows), g * rows)]
      if recipe == FP8_GMM_RECIPE:
        tgmm = config_table.TGMM_FP8_RECIPE
        fp8_calls += [(fp8("gmm_t_fp8", 2 * i, h), m), (fp8("gmm_t_fp8", h, i), m),
                      (fp8("tgmm_fp8", h, 2 * i, scale=tgmm), m), (fp8("tgmm_fp8", i, h, scale=tgmm), m)]
      for k_n, mm in fp8_calls:
        calls.setdefault(k_n, mm)
  return list(calls.items())
