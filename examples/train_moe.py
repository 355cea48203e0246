"""Train a small Mixture-of-Experts transformer LM with jgmm, data- and expert-parallel over all devices.

  python examples/train_moe.py                     # default size (one GPU): jgmm
  python examples/train_moe.py --compare           # also the same steps with jax.lax.ragged_dot; loss agreement
  python examples/train_moe.py --fp8               # also the same steps in FP8 (jgmm.fp8_gmm); loss agreement
  XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu python examples/train_moe.py --tiny

The corpus is generated here (byte-level sentences of small arithmetic and facts about made-up people), so
the run needs no download. One mesh axis "data" over the devices shards the batch and the experts: attention
is data-parallel, each MoE layer runs jgmm.moe.expert_parallel_moe_mlp under shard_map. Parameters are
float32, the model computes in bfloat16, optimiser adamw (optax). Prints tokens/s and the loss; writes
<out>/train_moe_loss.png when matplotlib is installed.
"""
import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jgmm import moe

try:
  shard_map = jax.shard_map
except AttributeError:  # jax without the top-level alias.
  from jax.experimental.shard_map import shard_map

VOCAB = 256  # bytes
AUX_LOSS_WEIGHT = 1e-2
NAMES = ["ada", "bo", "cyd", "dee", "eli", "fay", "gus", "hal", "ivy", "jo", "kai", "lu", "max", "ned", "oz", "pia"]
THINGS = ["apples", "books", "cats", "drums", "eggs", "flutes", "gems", "hats", "kites", "lamps", "maps", "nuts"]


def corpus(num_bytes: int, seed: int = 0) -> np.ndarray:
  """(num_bytes,) uint8 of generated sentences: sums, and how many things each made-up person has."""
  rng = np.random.default_rng(seed)
  owned = {(n, t): int(rng.integers(1, 20)) for n in NAMES for t in THINGS}  # facts repeated across the text
  pieces, size = [], 0
  while size < num_bytes:
    if rng.random() < 0.5:
      a, b = (int(v) for v in rng.integers(0, 50, 2))
      sentence = f"{a} plus {b} is {a + b}. "
    else:
      name, thing = NAMES[rng.integers(len(NAMES))], THINGS[rng.integers(len(THINGS))]
      sentence = f"{name} has {owned[name, thing]} {thing}. "
    pieces.append(sentence)
    size += len(sentence)
  return np.frombuffer("".join(pieces).encode()[:num_bytes], np.uint8)


def init_params(key, args):
  d, f, e, layers = args.d_model, args.d_ff, args.experts, args.layers
  keys = iter(jax.random.split(key, 4 + 6 * layers))
  normal = lambda fan_in, *shape: jax.random.normal(next(keys), shape, jnp.float32) / np.sqrt(fan_in)
  return {
      "embed": normal(1, VOCAB, d),
      "unembed": normal(d, d, VOCAB),
      "norm": jnp.ones(d),
      "layers": [{
          "attn_norm": jnp.ones(d), "qkv": normal(d, d, 3 * d), "out": normal(d, d, d),
          "mlp_norm": jnp.ones(d), "router": normal(d, d, e),
          "w_gate_up": normal(d, e, d, 2 * f), "w_down": normal(f, e, f, d),
      } for _ in range(layers)],
  }


def param_specs(params):
  """Expert weights sharded over "data" (expert parallelism), everything else replicated."""
  expert = lambda path, _: P("data") if path[-1].key in ("w_gate_up", "w_down") else P()
  return jax.tree_util.tree_map_with_path(expert, params)


def rms_norm(x, scale):
  x32 = x.astype(jnp.float32)
  return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6) * scale).astype(x.dtype)


def attention(x, layer, heads):
  b, s, d = x.shape
  q, k, v = jnp.split(x @ layer["qkv"].astype(x.dtype), 3, axis=-1)
  q, k, v = (t.reshape(b, s, heads, d // heads) for t in (q, k, v))
  return jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, s, d) @ layer["out"].astype(x.dtype)


def moe_block(tokens, router, w_gate_up, w_down, *, top_k, impl):
  """Inside shard_map: this device's tokens (T_local, D) and experts; returns (out, load-balancing loss)."""
  logits = jnp.dot(tokens.astype(jnp.float32), router)
  out = moe.expert_parallel_moe_mlp(tokens, logits, w_gate_up, w_down, top_k, axis_name="data", impl=impl)
  _, expert_ids = moe.route(logits, top_k)
  aux = moe.load_balancing_loss(logits, expert_ids, logits.shape[1])
  return out, jax.lax.pmean(aux, "data")


def loss_fn(params, tokens, *, args, mesh, impl):
  """Next-byte cross-entropy + AUX_LOSS_WEIGHT * mean load-balancing loss; tokens (B, S + 1) uint8."""
  inputs, targets = tokens[:, :-1].astype(jnp.int32), tokens[:, 1:].astype(jnp.int32)
  b, s = inputs.shape
  x = params["embed"].astype(jnp.bfloat16)[inputs]
  block = shard_map(functools.partial(moe_block, top_k=args.top_k, impl=impl), mesh=mesh,
                    in_specs=(P("data"), P(), P("data"), P("data")), out_specs=(P("data"), P()))
  aux_total = 0.0
  for layer in params["layers"]:
    x = x + attention(rms_norm(x, layer["attn_norm"]), layer, args.heads)
    h = rms_norm(x, layer["mlp_norm"]).reshape(b * s, -1)
    out, aux = block(h, layer["router"], layer["w_gate_up"].astype(x.dtype), layer["w_down"].astype(x.dtype))
    x = x + out.reshape(b, s, -1)
    aux_total = aux_total + aux
  logits = rms_norm(x, params["norm"]) @ params["unembed"].astype(x.dtype)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets).mean()
  return xent + AUX_LOSS_WEIGHT * aux_total / len(params["layers"]), xent


def progress(steps):
  try:
    from tqdm import tqdm
    return tqdm(range(steps), ncols=100)
  except ImportError:
    return range(steps)


def train(args, mesh, data, impl):
  """Trains args.steps steps with impl (a jgmm.moe impl: "jgmm", "fp8" or "ragged_dot"); returns (losses, tokens per second)."""
  optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, args.lr, 10, max(args.steps, 11)))
  specs = param_specs(init_params(jax.random.key(0), args))
  shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs)
  params = jax.jit(functools.partial(init_params, args=args), out_shardings=shardings)(jax.random.key(args.seed))
  replicated = NamedSharding(mesh, P())
  opt_state = jax.tree.map(lambda a: a if isinstance(a.sharding, NamedSharding) else jax.device_put(a, replicated),
                           jax.jit(optimizer.init)(params))  # step counts on the mesh too: one compilation
  batch_sharding = NamedSharding(mesh, P("data"))

  state_shardings = (shardings, jax.tree.map(lambda a: a.sharding, opt_state))  # fixed: one compilation

  @functools.partial(jax.jit, donate_argnums=(0, 1), out_shardings=(*state_shardings, replicated))
  def step(params, opt_state, tokens):
    (_, xent), grads = jax.value_and_grad(
        functools.partial(loss_fn, args=args, mesh=mesh, impl=impl), has_aux=True)(params, tokens)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, xent

  rng = np.random.default_rng(args.seed)  # the same batches for every impl
  losses, bar = [], progress(args.steps)
  start = None
  for i in bar:
    offsets = rng.integers(0, len(data) - args.seq - 1, args.batch)
    tokens = jax.device_put(np.stack([data[o:o + args.seq + 1] for o in offsets]), batch_sharding)
    params, opt_state, loss = step(params, opt_state, tokens)
    losses.append(float(loss))  # waits for the step
    if i == 0:
      start = time.perf_counter()  # the first step compiles: timed from its end
    if hasattr(bar, "set_postfix"):
      bar.set_postfix(loss=f"{losses[-1]:.3f}")
    elif i % max(args.steps // 10, 1) == 0:
      print(f"  step {i:5d}  loss {losses[-1]:.4f}", flush=True)
  timed_steps = args.steps - 1
  tokens_per_s = timed_steps * args.batch * args.seq / (time.perf_counter() - start) if timed_steps else float("nan")
  print(f"{impl}: {tokens_per_s:,.0f} tokens/s over {timed_steps} steps after the first; "
        f"final loss {losses[-1]:.4f}", flush=True)
  return np.asarray(losses), tokens_per_s


def plot(curves, path):
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    print("no loss plot: matplotlib is not installed")
    return
  fig, ax = plt.subplots(figsize=(7, 4))
  for name, losses in curves.items():
    ax.plot(losses, label=name)
  ax.set(xlabel="step", ylabel="train cross-entropy (nats/byte)", title="MoE LM")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"loss plot: {path}")


def parse_args(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--batch", type=int, default=16, help="global batch (sequences), a multiple of --devices")
  parser.add_argument("--seq", type=int, default=1024, help="sequence length (bytes)")
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--experts", type=int, default=16, help="a multiple of --devices")
  parser.add_argument("--top-k", type=int, default=2)
  parser.add_argument("--d-model", type=int, default=1024)
  parser.add_argument("--d-ff", type=int, default=2048, help="each expert's hidden width")
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--lr", type=float, default=1e-3)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--devices", type=int, default=None, help="use the first N devices (default: all)")
  parser.add_argument("--out", default="train_moe_out", help="folder for the loss plot")
  parser.add_argument("--compare", action="store_true", help="also train with jax.lax.ragged_dot and compare")
  parser.add_argument("--fp8", action="store_true",
                      help="also train with the experts' products in FP8 (moe impl 'fp8': jgmm.fp8_gmm) and compare")
  parser.add_argument("--tiny", action="store_true", help="a seconds-long CPU size (CI): overrides the sizes")
  args = parser.parse_args(argv)
  if args.tiny:
    args.batch, args.seq, args.layers, args.experts, args.d_model, args.d_ff, args.heads = 16, 32, 1, 8, 32, 32, 2
  return args


def main(argv=None):
  args = parse_args(argv)
  devices = jax.devices()[:args.devices]
  if args.batch % len(devices) or args.experts % len(devices):
    raise SystemExit(f"--batch ({args.batch}) and --experts ({args.experts}) must be multiples of the "
                     f"{len(devices)} devices")
  mesh = Mesh(np.array(devices), ("data",))
  print(f"devices: {len(devices)} x {devices[0].device_kind}; batch {args.batch} x seq {args.seq}; "
        f"{args.layers} layers, d_model {args.d_model}, {args.experts} experts (d_ff {args.d_ff}), "
        f"top-{args.top_k}", flush=True)
  data = corpus(max(1 << 20, 4 * args.batch * (args.seq + 1)), args.seed)
  curves, speeds = {}, {}
  impls = ["jgmm"] + ["fp8"] * args.fp8 + ["ragged_dot"] * args.compare
  for impl in impls:
    curves[impl], speeds[impl] = train(args, mesh, data, impl)
  for impl in impls[1:]:
    diff = np.abs(curves["jgmm"] - curves[impl])
    print(f"{impl} vs jgmm: max |loss difference| {diff.max():.4g} (mean {diff.mean():.3g}) over {args.steps} "
          f"steps; jgmm step speed / {impl}'s: {speeds['jgmm'] / speeds[impl]:.2f}x")
  os.makedirs(args.out, exist_ok=True)
  plot(curves, os.path.join(args.out, "train_moe_loss.png"))


if __name__ == "__main__":
  main()
