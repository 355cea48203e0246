"""Trace-time checks of every public argument: one place, specific messages.

Each `check_*` function raises TypeError (wrong kind or dtype) or ValueError (wrong shape or value) naming
the argument, what it saw and what it expected, and returns the normalised static arguments.
"""
import jax.numpy as jnp
from jax import lax
from jax._src import core

from jgmm import config as config_lib

FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
FP8_DTYPES = (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.float8_e4m3fnuz))
ACTIVATIONS = (None, "relu", "gelu", "gelu_tanh", "silu", "swiglu")
BACKENDS = (None, "triton", "xla")
_FLOAT_NAMES = "float32, bfloat16 or float16"
_FP8_NAMES = "float8_e4m3fn or float8_e4m3fnuz (FP8 operands go with scales)"


def _describe(x):
  return f"shape {tuple(x.shape)} and dtype {x.dtype}"


def _array(name, x, ndim, layout):
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise TypeError(f"{name} must be an array of shape {layout}, got {type(x).__name__}")
  if x.ndim != ndim:
    raise ValueError(f"{name} must be {ndim}-D {layout}, got {_describe(x)}")
  return x


def _float_array(name, x, ndim, layout, fp8=False):
  """x must be an ndim-D array of a float dtype jgmm multiplies: FP8 ones if fp8, else FLOAT_DTYPES."""
  _array(name, x, ndim, layout)
  dtypes, names = (FP8_DTYPES, _FP8_NAMES) if fp8 else (FLOAT_DTYPES, _FLOAT_NAMES)
  if jnp.dtype(x.dtype) not in dtypes:
    raise TypeError(f"{name} must have dtype {names}, got {_describe(x)}")
  return x


def _int_array(name, x, ndim, layout):
  _array(name, x, ndim, layout)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name} must have an integer dtype (int32), got {_describe(x)}")
  return x


def _same_dtype(name, x, other_name, other):
  if x.dtype != other.dtype:
    raise TypeError(f"{name} must have the dtype of {other_name} ({other.dtype}), got {_describe(x)}; cast one "
                    f"of them (e.g. {name}.astype({other_name}.dtype): gradients flow back through the cast)")


def _static_groups(name, x, axis, layout):
  if core.is_symbolic_dim(x.shape[axis]):
    raise ValueError(f"{name} must have a static group count (axis {axis} of {layout}); got shape {tuple(x.shape)} "
                     "with a symbolic one: export with a concrete number of groups (M, K and N may be symbolic)")


def _precision(precision):
  """"highest" where `precision` asks for exact float32 products, else None (TF32 allowed on NVIDIA GPUs).

  Takes what jax.lax.dot takes: None, a lax.Precision or its name, a pair of them, or a lax.DotAlgorithmPreset."""
  parts = precision if isinstance(precision, (tuple, list)) else (precision,)
  exact = False
  for part in parts:
    if part is None:
      continue
    if isinstance(part, lax.DotAlgorithmPreset):
      exact |= part == lax.DotAlgorithmPreset.F32_F32_F32
      continue
    try:
      exact |= lax.Precision(part) == lax.Precision.HIGHEST
    except (ValueError, TypeError):
      raise ValueError(f"precision must be None, a jax.lax.Precision (or its name: 'default', 'high', 'highest', "
                       f"'bfloat16', 'tensorfloat32', 'float32'), a pair of them or a lax.DotAlgorithmPreset, got "
                       f"{precision!r}") from None
  return "highest" if exact else None


def _shape(name, x, expected, layout):
  if tuple(x.shape) != tuple(expected):
    raise ValueError(f"{name} must have shape {layout} = {tuple(expected)}, got {_describe(x)}")


def _flag(name, value):
  if type(value) is not bool:
    raise TypeError(f"{name} must be a Python bool, got {value!r}")
  return value


def _out_dtype(preferred_element_type, input_dtype):
  if preferred_element_type is None:
    return jnp.dtype(input_dtype)
  try:
    dtype = jnp.dtype(preferred_element_type)
  except TypeError:
    raise TypeError(f"preferred_element_type must be a dtype ({_FLOAT_NAMES}) or None, "
                    f"got {preferred_element_type!r}") from None
  if dtype not in FLOAT_DTYPES:
    raise TypeError(f"preferred_element_type must be {_FLOAT_NAMES} or None, got {dtype}")
  return dtype


def _group_offset(group_offset):
  if group_offset is None:
    return
  if type(group_offset) is int:
    if not -2**31 <= group_offset < 2**31:
      raise ValueError(f"group_offset must fit in int32, got {group_offset}")
    return
  if not hasattr(group_offset, "dtype") or not jnp.issubdtype(group_offset.dtype, jnp.integer):
    raise TypeError(f"group_offset must be an int or an integer array of shape () or (1,), got {group_offset!r}")
  if tuple(group_offset.shape) not in ((), (1,)):
    raise ValueError(f"group_offset must have shape () or (1,), got {_describe(group_offset)}")


def _backend(backend):
  if backend not in BACKENDS:
    raise ValueError(f"backend must be None, 'triton' or 'xla', got {backend!r}")
  return backend


def _nonneg_int(name, value):
  if value is None:
    return None
  if type(value) is not int:
    raise TypeError(f"{name} must be a non-negative Python int or None, got {value!r}")
  if value < 0:
    raise ValueError(f"{name} must be a non-negative Python int or None, got {value!r}")
  return value


def check_gmm(lhs, rhs, group_sizes, bias, transpose_rhs, preferred_element_type, group_offset,
              existing_out, activation, precision, config, backend, fp8=False):
  """Validates gmm's arguments (FP8 lhs and rhs if fp8); returns (m, k, n, out_n, out_dtype, precision, config,
  backend)."""
  _float_array("lhs", lhs, 2, "(M, K)", fp8)
  rhs_layout = "(G, N, K)" if _flag("transpose_rhs", transpose_rhs) else "(G, K, N)"
  _float_array("rhs", rhs, 3, rhs_layout, fp8)
  _same_dtype("rhs", rhs, "lhs", lhs)
  m, k = lhs.shape
  num_groups, rhs_k, n = (rhs.shape[0], rhs.shape[2], rhs.shape[1]) if transpose_rhs else rhs.shape
  if rhs_k != k:
    hint = ""
    if core.definitely_equal(rhs.shape[1] if transpose_rhs else rhs.shape[2], k):  # The other layout matches.
      hint = ("; for a (G, K, N) rhs leave transpose_rhs=False" if transpose_rhs else
              "; for a (G, N, K) rhs (rows of each weight are outputs) pass transpose_rhs=True")
    raise ValueError(f"rhs must have K = {k} (lhs is {tuple(lhs.shape)}) in its layout {rhs_layout}, "
                     f"got shape {tuple(rhs.shape)}{hint}")
  _static_groups("rhs", rhs, 0, rhs_layout)
  if num_groups < 1:
    raise ValueError(f"rhs must hold at least one group, got shape {tuple(rhs.shape)}")
  _int_array("group_sizes", group_sizes, 1, "(G,)")
  _static_groups("group_sizes", group_sizes, 0, "(G,)")
  _group_offset(group_offset)
  if group_offset is None and group_sizes.shape[0] != num_groups:
    raise ValueError(f"group_sizes must have shape (G,) = ({num_groups},) matching rhs {tuple(rhs.shape)}, "
                     f"got {_describe(group_sizes)}; pass group_offset for a local slice of the groups")
  if group_offset is not None and group_sizes.shape[0] < num_groups:
    raise ValueError(f"group_sizes must have at least G = {num_groups} entries (rhs {tuple(rhs.shape)}), "
                     f"got {_describe(group_sizes)}")
  if activation not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
  if activation == "swiglu" and n % 2:
    raise ValueError(f"activation='swiglu' needs an even N ([gate | up] halves), got N = {n}")
  out_n = n // 2 if activation == "swiglu" else n
  if bias is not None:
    _float_array("bias", bias, 2, "(G, N)")
    _shape("bias", bias, (num_groups, n), "(G, N)")
  out_dtype = _out_dtype(preferred_element_type, lhs.dtype)
  if existing_out is not None:
    _float_array("existing_out", existing_out, 2, "(M, N)")
    _shape("existing_out", existing_out, (m, out_n), "(M, N_out)")
    if existing_out.dtype != out_dtype:
      raise TypeError(f"existing_out must have the output dtype {out_dtype}, got {_describe(existing_out)}")
  return (m, k, n, out_n, out_dtype, _precision(precision), config_lib.as_config(config, fp8 and transpose_rhs),
          _backend(backend))


def check_tgmm(lhs, rhs, group_sizes, transpose_lhs, transpose_rhs, preferred_element_type, group_offset,
               num_actual_groups, existing_out, bias_grad, precision, config, backend, fp8=False,
               rhs_scale_per_group=False):
  """Validates tgmm's arguments (FP8 lhs and rhs if fp8); returns (m, k, n, num_groups, out_dtype, precision,
  config, backend)."""
  if _flag("rhs_scale_per_group", rhs_scale_per_group) and not fp8:
    raise ValueError("rhs_scale_per_group=True applies to FP8 lhs and rhs with lhs_scale and rhs_scale; got no "
                     "scales")
  lhs_layout = "(M, K)" if _flag("transpose_lhs", transpose_lhs) else "(K, M)"
  rhs_layout = "(N, M)" if _flag("transpose_rhs", transpose_rhs) else "(M, N)"
  _float_array("lhs", lhs, 2, lhs_layout, fp8)
  _float_array("rhs", rhs, 2, rhs_layout, fp8)
  _same_dtype("rhs", rhs, "lhs", lhs)
  m, k = lhs.shape if transpose_lhs else lhs.shape[::-1]
  n, rhs_m = rhs.shape if transpose_rhs else rhs.shape[::-1]
  if rhs_m != m:
    raise ValueError(f"rhs must be {rhs_layout} with M = {m} (lhs is {tuple(lhs.shape)} in layout {lhs_layout}), "
                     f"got shape {tuple(rhs.shape)}")
  _int_array("group_sizes", group_sizes, 1, "(G,)")
  _static_groups("group_sizes", group_sizes, 0, "(G,)")
  total_groups = group_sizes.shape[0]
  if total_groups < 1:
    raise ValueError(f"group_sizes must hold at least one group, got {_describe(group_sizes)}")
  _group_offset(group_offset)
  num_groups = total_groups if num_actual_groups is None else num_actual_groups
  if type(num_groups) is not int:
    raise TypeError(f"num_actual_groups must be a Python int in [1, {total_groups}] (len(group_sizes)) "
                    f"or None, got {num_actual_groups!r}")
  if not 1 <= num_groups <= total_groups:
    raise ValueError(f"num_actual_groups must be a Python int in [1, {total_groups}] (len(group_sizes)) "
                     f"or None, got {num_actual_groups!r}")
  if group_offset is None and num_groups != total_groups:
    raise ValueError("num_actual_groups < len(group_sizes) needs group_offset (which groups are local), "
                     f"got num_actual_groups={num_groups} and no group_offset")
  out_dtype = _out_dtype(preferred_element_type, lhs.dtype)
  if existing_out is not None:
    _float_array("existing_out", existing_out, 3, "(G, K, N)")
    _shape("existing_out", existing_out, (num_groups, k, n), "(G, K, N)")
    if existing_out.dtype != out_dtype:
      raise TypeError(f"existing_out must have the output dtype {out_dtype}, got {_describe(existing_out)}")
  _flag("bias_grad", bias_grad)
  return (m, k, n, num_groups, out_dtype, _precision(precision), config_lib.as_config(config),
          _backend(backend))


def check_masked_gmm(x, w, masked_m, preferred_element_type, expected_m, precision, config, backend, fp8=False):
  """Validates masked_gmm's arguments (FP8 x and w if fp8); returns (out_dtype, precision, config, backend)."""
  _float_array("x", x, 3, "(G, max_m, K)", fp8)
  _float_array("w", w, 3, "(G, N, K)", fp8)
  _same_dtype("w", w, "x", x)
  _static_groups("x", x, 0, "(G, max_m, K)")
  num_groups, _, k = x.shape
  if w.shape[0] != num_groups or w.shape[2] != k:
    raise ValueError(f"w must be (G, N, K) with G = {num_groups} and K = {k} (x is {tuple(x.shape)}), "
                     f"got shape {tuple(w.shape)}")
  _int_array("masked_m", masked_m, 1, "(G,)")
  _shape("masked_m", masked_m, (num_groups,), "(G,)")
  _nonneg_int("expected_m", expected_m)
  return (_out_dtype(preferred_element_type, x.dtype), _precision(precision), config_lib.as_config(config, fp8),
          _backend(backend))


def check_grouped_matmul(lhs_list, rhs_list, lhs_scales, rhs_scales, transpose_rhs, preferred_element_type,
                         precision, config, backend):
  """Validates grouped_matmul's arguments: FP8 operands with scales where any scale or FP8 operand is given (all
  problems of one scale recipe, each operand's as gmm's), else float ones. Returns (scaled, out_dtype, precision,
  config, backend)."""
  for name, arrays in (("lhs_list", lhs_list), ("rhs_list", rhs_list)):
    if not isinstance(arrays, (list, tuple)):
      raise TypeError(f"{name} must be a list of 2-D arrays, got {type(arrays).__name__}")
  if not lhs_list:
    raise ValueError("lhs_list must hold at least one problem, got an empty list")
  if len(rhs_list) != len(lhs_list):
    raise ValueError(f"rhs_list must hold one array per lhs array ({len(lhs_list)}), got {len(rhs_list)}")
  scaled = fp8_requested((*lhs_list, *rhs_list), (lhs_scales, rhs_scales))
  if scaled:
    _no_fp8_option("precision", precision)
    for name, scales in (("lhs_scales", lhs_scales), ("rhs_scales", rhs_scales)):
      if not isinstance(scales, (list, tuple)):
        raise TypeError(f"{name} must be a list of float32 arrays, one per problem ({len(lhs_list)}), with FP8 "
                        f"operands, got {type(scales).__name__}")
      if len(scales) != len(lhs_list):
        raise ValueError(f"{name} must hold one scale array per problem ({len(lhs_list)}), got {len(scales)}")
  rhs_layout = "(N_i, K_i)" if _flag("transpose_rhs", transpose_rhs) else "(K_i, N_i)"
  recipes = []
  for i, (lhs, rhs) in enumerate(zip(lhs_list, rhs_list)):
    _float_array(f"lhs_list[{i}]", lhs, 2, "(M_i, K_i)", scaled)
    _float_array(f"rhs_list[{i}]", rhs, 2, rhs_layout, scaled)
    for name, x in ((f"lhs_list[{i}]", lhs), (f"rhs_list[{i}]", rhs)):
      _same_dtype(name, x, "lhs_list[0]", lhs_list[0])
    m, k = lhs.shape
    rhs_k, n = rhs.shape[::-1] if transpose_rhs else rhs.shape
    if rhs_k != k:
      raise ValueError(f"rhs_list[{i}] must have K_i = {k} (lhs_list[{i}] is {tuple(lhs.shape)}) in its "
                       f"layout {rhs_layout}, got shape {tuple(rhs.shape)}")
    if scaled:
      recipes.append((_scale(f"lhs_scales[{i}]", lhs_scales[i], f"lhs_list[{i}]",
                             _activation_scales(m, k, i="_i")),
                      _scale(f"rhs_scales[{i}]", rhs_scales[i], f"rhs_list[{i}]", _weight_scales(n, k, i="_i"))))
      if recipes[i] != recipes[0]:
        raise ValueError(f"lhs_scales[{i}] and rhs_scales[{i}] must follow problem 0's recipe ({recipes[0][0]}, "
                         f"{recipes[0][1]}): one recipe for all problems, got {recipes[i][0]}, {recipes[i][1]}")
  out_dtype = _out_dtype(_fp8_out_dtype(preferred_element_type) if scaled else preferred_element_type,
                         lhs_list[0].dtype)
  return scaled, out_dtype, _precision(precision), config_lib.as_config(config), _backend(backend)


# --------------------------------------------------------------------------------------------------------------
# jgmm.moe: routing, permutation and the MoE layers.

SCORES = ("softmax", "sigmoid")
MOE_IMPLS = ("jgmm", "fp8", "ragged_dot")
MOE_LAYOUTS = ("contiguous", "masked")
DISPATCHES = (None, "ragged", "padded")


def _positive_int(name, value, upper=None):
  bound = "" if upper is None else f" <= {upper}"
  if type(value) is not int or value < 1 or (upper is not None and value > upper):
    raise ValueError(f"{name} must be a Python int >= 1{bound}, got {value!r}")
  return value


def _choice(name, value, choices):
  if value not in choices:
    raise ValueError(f"{name} must be one of {choices}, got {value!r}")
  return value


def check_route(router_logits, top_k, score, renormalize, bias):
  """Validates route's arguments."""
  _float_array("router_logits", router_logits, 2, "(T, E)")
  num_experts = router_logits.shape[1]
  _positive_int("top_k", top_k, num_experts)
  _choice("score", score, SCORES)
  _flag("renormalize", renormalize)
  if bias is not None:
    _float_array("bias", bias, 1, "(E,)")
    _shape("bias", bias, (num_experts,), "(E,)")


def check_permute(x, expert_ids, num_experts, capacity):
  """Validates permute's arguments."""
  _array("x", x, 2, "(T, H)")
  _int_array("expert_ids", expert_ids, 2, "(T, top_k)")
  if expert_ids.shape[0] != x.shape[0]:
    raise ValueError(f"expert_ids must be (T, top_k) with T = {x.shape[0]} (x is {tuple(x.shape)}), "
                     f"got {_describe(expert_ids)}")
  _positive_int("num_experts", num_experts)
  if capacity is not None:
    _nonneg_int("capacity", capacity)


def check_unpermute(y, num_rows, weights, num_tokens, top_k):
  """Validates unpermute's arguments (num_rows = T * top_k rows of the permutation)."""
  _array("y", y, 2, "(T * top_k, N)")
  if y.shape[0] != num_rows:
    raise ValueError(f"y must have T * top_k = {num_rows} rows (the permutation's), got {_describe(y)}")
  if weights is not None:
    _float_array("weights", weights, 2, "(T, top_k)")
    _shape("weights", weights, (num_tokens, top_k), "(T, top_k)")


def check_expert_weights(x, w_gate_up, w_down, activation, names=("w_gate_up", "w_down"), stacked=True):
  """Validates an MLP's weights for x (T, H), stacked over experts (E, ...) or not; returns (E or None, F)."""
  _float_array("x", x, 2, "(T, H)")
  hidden = x.shape[1]
  if activation not in ACTIVATIONS or activation is None:
    raise ValueError(f"activation must be one of {ACTIVATIONS[1:]}, got {activation!r}")
  lead = "(E, " if stacked else "("
  gate_up_layout = f"{lead}H, 2F) ([gate | up] halves)" if activation == "swiglu" else f"{lead}H, F)"
  _float_array(names[0], w_gate_up, 2 + stacked, gate_up_layout)
  _same_dtype(names[0], w_gate_up, "x", x)
  _float_array(names[1], w_down, 2 + stacked, f"{lead}F, H)")
  _same_dtype(names[1], w_down, "x", x)
  gate_up_h, width = w_gate_up.shape[-2:]
  if gate_up_h != hidden or (activation == "swiglu" and width % 2):
    raise ValueError(f"{names[0]} must be {gate_up_layout} with H = {hidden} (x is {tuple(x.shape)}), "
                     f"got {_describe(w_gate_up)}")
  ffn = width // 2 if activation == "swiglu" else width
  experts = w_gate_up.shape[0] if stacked else None
  _shape(names[1], w_down, (experts, ffn, hidden)[1 - stacked:], f"{lead}F, H)")
  return experts, ffn


def check_shared_experts(x, shared_experts, activation):
  """Validates shared_experts = (w_gate_up (H, 2Fs), w_down (Fs, H)) for x (T, H)."""
  if not isinstance(shared_experts, (tuple, list)) or len(shared_experts) != 2:
    raise TypeError(f"shared_experts must be a pair (w_gate_up (H, 2Fs), w_down (Fs, H)) or None, "
                    f"got {type(shared_experts).__name__}")
  check_expert_weights(x, *shared_experts, activation, names=("shared_experts[0]", "shared_experts[1]"),
                       stacked=False)


def check_expert_mlp(rows, group_sizes, w_gate_up, w_down, activation, impl, layout, max_rows_per_expert,
                     fp8_weights, weights_type, fp8_dtype):
  """Validates expert_mlp's arguments (fp8_weights: None or a pair of weights_type, jgmm.fp8.Fp8Weights, in FP8
  format fp8_dtype); returns (E, F)."""
  _choice("impl", impl, MOE_IMPLS)
  _choice("layout", layout, MOE_LAYOUTS)
  if impl != "jgmm" and layout == "masked":
    raise ValueError(f"layout='masked' runs jgmm.masked_gmm; it has no impl={impl!r} form (use impl='jgmm')")
  _nonneg_int("max_rows_per_expert", max_rows_per_expert)
  experts, ffn = check_expert_weights(rows, w_gate_up, w_down, activation, stacked=True)
  _int_array("group_sizes", group_sizes, 1, "(E,)")
  _shape("group_sizes", group_sizes, (experts,), "(E,)")
  if fp8_weights is not None:
    if impl != "fp8":
      raise ValueError(f"fp8_weights (the weights quantised ahead) go with impl='fp8', got impl={impl!r}")
    if not isinstance(fp8_weights, (tuple, list)) or len(fp8_weights) != 2:
      raise TypeError("fp8_weights must be a pair (jgmm.quantize_weights(w_gate_up), jgmm.quantize_weights(w_down)) "
                      f"or None, got {type(fp8_weights).__name__}")
    hidden, width = w_gate_up.shape[1:]
    for i, (k, n) in enumerate(((hidden, width), (ffn, hidden))):
      check_fp8_weights(fp8_weights[i], weights_type, experts, k, n, False, fp8_dtype, name=f"fp8_weights[{i}]")
  return experts, ffn


def check_grouped_gemm(x, w, expert_ids):
  """Validates grouped_gemm's x (T, H) and w (E, H, O) (expert_ids are checked by permute)."""
  _float_array("x", x, 2, "(T, H)")
  _float_array("w", w, 3, "(E, H, O)")
  if w.shape[1] != x.shape[1]:
    raise ValueError(f"w must be (E, H, O) with H = {x.shape[1]} (x is {tuple(x.shape)}), got {_describe(w)}")


def check_moe(x, router_logits, w_gate_up, w_down, activation, expert_shards=1, dispatch=None):
  """Validates moe_mlp's router_logits against its weights (w_* hold E / expert_shards local experts)."""
  _float_array("router_logits", router_logits, 2, "(T, E)")
  if router_logits.shape[0] != x.shape[0]:
    raise ValueError(f"router_logits must be (T, E) with T = {x.shape[0]} (x is {tuple(x.shape)}), "
                     f"got {_describe(router_logits)}")
  _choice("dispatch", dispatch, DISPATCHES)
  local_experts, _ = check_expert_weights(x, w_gate_up, w_down, activation)
  experts = router_logits.shape[1]
  if local_experts * expert_shards != experts:
    shards = "" if expert_shards == 1 else f" / {expert_shards} expert shards"
    raise ValueError(f"w_gate_up must hold E{shards} = {experts // expert_shards} experts (router_logits is "
                     f"{tuple(router_logits.shape)}), got shape {tuple(w_gate_up.shape)}")


# ---------------------------------------------------------------------------------------------------------------
# FP8 operands with scales (jgmm.fp8)


def is_fp8(x):
  """Whether x is an array of an FP8 dtype (the operands that need scales)."""
  return hasattr(x, "dtype") and jnp.dtype(x.dtype) in FP8_DTYPES


def fp8_requested(operands, scales):
  """Whether a call is an FP8 one: any scale given (not None) or any FP8 operand."""
  return any(s is not None for s in scales) or any(is_fp8(a) for a in operands)


def _cdiv(a, b):
  return -(-a // b)


def _scale(name, scale, operand, options):
  """scale must be a float32 array of one of options [(layout, shape, recipe)] for the FP8 operand `operand`."""
  expected = " or ".join(f"{layout} = {shape} ({recipe})" for layout, shape, recipe in options)
  if scale is None:
    raise ValueError(f"{name} is required with the FP8 {operand}: float32 of shape {expected}, got None")
  if not hasattr(scale, "shape") or not hasattr(scale, "dtype"):
    raise TypeError(f"{name} must be a float32 array of shape {expected}, got {type(scale).__name__}")
  if scale.dtype != jnp.float32:
    raise TypeError(f"{name} must have dtype float32, got {_describe(scale)}")
  recipes = {shape: recipe for _, shape, recipe in options}
  if tuple(scale.shape) not in recipes:
    raise ValueError(f"{name} must have shape {expected}, got {_describe(scale)}")
  return recipes[tuple(scale.shape)]


def _layout(*names):
  """A shape's description: (M,), (G, N), ..."""
  return f"({', '.join(names)}{',' if len(names) == 1 else ''})"


def _activation_scales(m, k, lead=(), lead_shape=(), rows="M", i=""):
  """The scale options of an FP8 activation (*lead_shape, m, k) (dimensions named lead, rows and K, suffixed i): per
  row, or per 1x128 block."""
  return [(_layout(*lead, rows + i), (*lead_shape, m), "per row"),
          (_layout(*lead, rows + i, f"cdiv(K{i}, 128)"), (*lead_shape, m, _cdiv(k, 128)), "1x128 blocks")]


def _weight_scales(n, k, lead=(), lead_shape=(), i=""):
  """The scale options of FP8 weights of (*lead_shape) N x K products (dimensions named lead, N and K, suffixed i):
  per channel, or per 128x128 block."""
  return [(_layout(*lead, "N" + i), (*lead_shape, n), "per channel"),
          (_layout(*lead, f"cdiv(N{i}, 128)", f"cdiv(K{i}, 128)"), (*lead_shape, _cdiv(n, 128), _cdiv(k, 128)),
           "128x128 blocks")]


def _no_fp8_option(name, value, default=None):
  if value is not default:
    raise ValueError(f"{name} is not supported with FP8 operands (scales given), got {value!r}")


def check_fp8_dtype(name, dtype):
  """dtype must be an FP8 format jgmm multiplies; returns it as a dtype."""
  dtype = jnp.dtype(dtype)
  if dtype not in FP8_DTYPES:
    raise TypeError(f"{name} must be float8_e4m3fn or float8_e4m3fnuz, got {dtype}")
  return dtype


def check_quantize_pair(x, recipe, dtype, backend):
  """Validates jgmm.fp8.quantize_pair's arguments; returns (dtype, backend)."""
  if recipe not in ("1x128", "128x128"):
    raise ValueError(f"recipe must be '1x128' or '128x128', got {recipe!r}")
  if x.ndim != 2 and not (recipe == "128x128" and x.ndim == 3):
    raise ValueError(f"x must be (R, C){' or (G, R, C)' if recipe == '128x128' else ''} for recipe {recipe!r}, "
                     f"got shape {x.shape}")
  if jnp.dtype(x.dtype) not in FLOAT_DTYPES:
    raise TypeError(f"x must be bfloat16, float16 or float32, got {x.dtype}")
  return check_fp8_dtype("dtype", dtype), _backend(backend)


def check_quantize_weights(rhs, transpose_rhs, fp8_dtype):
  """Validates jgmm.fp8.quantize_weights's own arguments (quantize_pair checks backend)."""
  _float_array("rhs", rhs, 3, "(G, N, K)" if _flag("transpose_rhs", transpose_rhs) else "(G, K, N)")
  check_fp8_dtype("fp8_dtype", fp8_dtype)


def check_fp8_weights(weights, weights_type, g, k, n, transpose_rhs, fp8_dtype, name="rhs_fp8"):
  """`name`, weights of G x (K, N) products quantised ahead: a weights_type (jgmm.fp8.Fp8Weights) made
  (quantize_weights) for the call's layout and FP8 format, its arrays of those shapes."""
  if not isinstance(weights, weights_type):
    raise TypeError(f"{name} must be jgmm.Fp8Weights (jgmm.quantize_weights of the weights), got "
                    f"{type(weights).__name__}")
  if weights.transpose_rhs != transpose_rhs:
    raise ValueError(f"{name} was made with transpose_rhs={weights.transpose_rhs}, but the call reads weights with "
                     f"transpose_rhs={transpose_rhs}: make it with "
                     f"quantize_weights(..., transpose_rhs={transpose_rhs})")
  for field, (a, b), (a_size, b_size) in (("nk", "NK", (n, k)), ("kn", "KN", (k, n))):
    q = _array(f"{name}.{field}", getattr(weights, field), 3, f"(G, {a}, {b})")
    if q.dtype != fp8_dtype:
      raise TypeError(f"{name}.{field} must have the call's FP8 format {fp8_dtype}, got {_describe(q)}: make it with "
                      f"quantize_weights(..., fp8_dtype=jnp.{fp8_dtype})")
    _shape(f"{name}.{field}", q, (g, a_size, b_size), f"(G, {a}, {b})")
    _scale(f"{name}.{field}_scale", getattr(weights, f"{field}_scale"), f"{name}.{field}",
           [(f"(G, cdiv({a}, 128), cdiv({b}, 128))", (g, _cdiv(a_size, 128), _cdiv(b_size, 128)), "128x128 blocks")])


def _fp8_out_dtype(preferred_element_type):
  return preferred_element_type if preferred_element_type is not None else jnp.bfloat16


def check_gmm_fp8(lhs, rhs, group_sizes, lhs_scale, rhs_scale, bias, transpose_rhs, preferred_element_type,
                  group_offset, existing_out, activation, precision, config, backend):
  """Validates FP8 gmm's arguments; returns (out_dtype, config, backend)."""
  for name, value in (("bias", bias), ("existing_out", existing_out), ("activation", activation),
                      ("precision", precision)):
    _no_fp8_option(name, value)
  m, k, n, _, out_dtype, _, config, backend = check_gmm(
      lhs, rhs, group_sizes, None, transpose_rhs, _fp8_out_dtype(preferred_element_type), group_offset, None,
      None, None, config, backend, fp8=True)
  _scale("lhs_scale", lhs_scale, "lhs", _activation_scales(m, k))
  _scale("rhs_scale", rhs_scale, "rhs", _weight_scales(n, k, ("G",), rhs.shape[:1]))
  return out_dtype, config, backend


def check_masked_gmm_fp8(x, w, masked_m, x_scale, w_scale, preferred_element_type, expected_m, precision, config,
                         backend):
  """Validates FP8 masked_gmm's arguments; returns (out_dtype, config, backend)."""
  _no_fp8_option("precision", precision)
  out_dtype, _, config, backend = check_masked_gmm(x, w, masked_m, _fp8_out_dtype(preferred_element_type),
                                                   expected_m, None, config, backend, fp8=True)
  g, max_m, k = x.shape
  _scale("x_scale", x_scale, "x", _activation_scales(max_m, k, ("G",), (g,), "max_m"))
  _scale("w_scale", w_scale, "w", _weight_scales(w.shape[1], k, ("G",), (g,)))
  return out_dtype, config, backend


def check_tgmm_fp8(lhs, rhs, group_sizes, lhs_scale, rhs_scale, transpose_lhs, transpose_rhs,
                   preferred_element_type, group_offset, num_actual_groups, existing_out, bias_grad, precision, config,
                   backend, rhs_scale_per_group=False, transpose_out=False):
  """Validates FP8 tgmm's arguments; returns (m, num_groups, out_dtype, config, backend)."""
  _flag("transpose_out", transpose_out)
  _no_fp8_option("existing_out", existing_out)
  _no_fp8_option("precision", precision)
  _no_fp8_option("bias_grad", bias_grad, False)
  m, k, n, num_groups, out_dtype, _, config, backend = check_tgmm(
      lhs, rhs, group_sizes, transpose_lhs, transpose_rhs, _fp8_out_dtype(preferred_element_type), group_offset,
      num_actual_groups, None, False, None, config, backend, fp8=True)
  mb = _cdiv(m, 128)
  lhs_option = ("(cdiv(M, 128), K)", (mb, k), "128x1 blocks") if transpose_lhs else (
      "(K, cdiv(M, 128))", (k, mb), "1x128 blocks of lhs (K, M)")
  rhs_option = ("(N, cdiv(M, 128))", (n, mb), "1x128 blocks of rhs (N, M)") if transpose_rhs else (
      "(cdiv(M, 128), N)", (mb, n), "128x1 blocks")
  if _flag("rhs_scale_per_group", rhs_scale_per_group):  # One per group of group_sizes and column.
    g = group_sizes.shape[0]
    rhs_option = ("(N, G)", (n, g), "per group and column of rhs (N, M)") if transpose_rhs else (
        "(G, N)", (g, n), "per group and column")
  _scale("lhs_scale", lhs_scale, "lhs", [lhs_option])
  _scale("rhs_scale", rhs_scale, "rhs", [rhs_option])
  return m, num_groups, out_dtype, config, backend
