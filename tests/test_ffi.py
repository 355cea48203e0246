"""Tests of jgmm.ffi: the Triton -> XLA bridge.

CPU: kernels under Triton's interpreter through triton_call inside jit; cross-lowering for 'cuda' (and 'rocm')
with JGMM_TARGET, checking the custom call and the compiled binary's architecture. GPU (skipped without one):
the same kernels through the real custom call in jit/grad/vmap.
"""

import inspect
import os
import re
import zlib
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl
from absl.testing import absltest, parameterized

from jgmm import ffi
from jgmm.ffi import _compile, _jaxlib

try:  # Gluon's Hopper TMA multicast and clusters (Triton >= 3.7)
  from triton.experimental import gluon
  from triton.experimental.gluon import language as gl
  from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma
  _HAS_MULTICAST = "multicast" in inspect.signature(tma.async_load).parameters
except (ImportError, AttributeError):
  _HAS_MULTICAST = False

_CPU = jax.devices("cpu")[0]
_HAS_GPU = any(d.platform == "gpu" for d in jax.devices())
_HAS_HIP_BACKEND = "amd" in triton.backends.backends

# --------------------------------------------------------------------------------------------------------------
# Kernels


@triton.jit
def _add_kernel(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, M, N, K, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
  """c (M, N) = a (M, K) @ b (K, N), row-major fp32, any M, N, K."""
  rows = tl.program_id(0) * BM + tl.arange(0, BM)
  cols = tl.program_id(1) * BN + tl.arange(0, BN)
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k0 in range(0, K, BK):
    ks = k0 + tl.arange(0, BK)
    a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
    b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
    acc += tl.dot(a, b, input_precision="ieee")
  tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _scale_prefix_kernel(x_ptr, n_written, scale, out_ptr, BLOCK: tl.constexpr):
  """out[:n_written] = x[:n_written] * scale; the rest of out is not written."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_written
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * scale, mask=mask)


@triton.jit
def _scale_prefix_inplace_kernel(x_ptr, n_written, scale, BLOCK: tl.constexpr):
  """x[:n_written] *= scale, for an output aliased to x (no separate output param)."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_written
  tl.store(x_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * scale, mask=mask)


@triton.jit
def _two_outputs_prefix_kernel(x_ptr, n_written, zeroed_ptr, poisoned_ptr, index_ptr, BLOCK: tl.constexpr):
  """Writes x+1 into the first n_written elements of two float outputs and an int32 output."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  mask = offsets < n_written
  x = tl.load(x_ptr + offsets, mask=mask)
  tl.store(zeroed_ptr + offsets, x + 1, mask=mask)
  tl.store(poisoned_ptr + offsets, x + 1, mask=mask)
  tl.store(index_ptr + offsets, offsets, mask=mask)


@triton.jit
def _accumulate_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
  """out[i % BLOCK] += x[i]: correct only if out starts at zero."""
  offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
  tl.atomic_add(out_ptr + tl.arange(0, BLOCK), tl.load(x_ptr + offsets, mask=offsets < n, other=0.0))


@triton.jit
def _descriptor_scale_kernel(x_ptr, M, N, out_ptr, BM: tl.constexpr, BN: tl.constexpr):
  """out = 2 x through device-side tensor descriptors (needs Triton global scratch on sm_90)."""
  x_desc = tl.make_tensor_descriptor(x_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
  out_desc = tl.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
  row, col = tl.program_id(0) * BM, tl.program_id(1) * BN
  out_desc.store([row, col], x_desc.load([row, col]) * 2)


@triton.jit
def _descriptor_matmul_kernel(a_desc, b_desc, M, N, K, c_ptr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
  """c (M, N) = a (M, K) @ b (K, N), loading a and b through host tensor descriptors (zero padding)."""
  row, col = tl.program_id(0) * BM, tl.program_id(1) * BN
  acc = tl.zeros((BM, BN), dtype=tl.float32)
  for k0 in range(0, K, BK):
    acc += tl.dot(a_desc.load([row, k0]), b_desc.load([k0, col]), input_precision="ieee")
  rows, cols = row + tl.arange(0, BM), col + tl.arange(0, BN)
  tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc, mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def _descriptor_tile_copy_kernel(x_desc, out_cols, out_ptr, BM: tl.constexpr, BN: tl.constexpr):
  """Copies whole (BM, BN) tiles of x, padding included, into out (tile multiples of x's shape)."""
  row, col = tl.program_id(0) * BM, tl.program_id(1) * BN
  rows, cols = row + tl.arange(0, BM), col + tl.arange(0, BN)
  tl.store(out_ptr + rows[:, None] * out_cols + cols[None, :], x_desc.load([row, col]))


@triton.jit
def _tuple_scale_kernel(xs, n, outs, P: tl.constexpr, BLOCK: tl.constexpr):
  """outs[p][:n] = (p + 1) * xs[p][:n] for program p: tuple params indexed by a runtime p through selects."""
  p = tl.program_id(0)
  x, out = xs[0], outs[0]
  for i in tl.static_range(1, P):
    x = tl.where(p == i, xs[i], x)
    out = tl.where(p == i, outs[i], out)
  offsets = tl.arange(0, BLOCK)
  tl.store(out + offsets, tl.load(x + offsets, mask=offsets < n) * (p + 1), mask=offsets < n)


@triton.jit
def _multiply_add_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  x = tl.load(x_ptr + offsets)
  tl.store(out_ptr + offsets, x * 3.0 + x * x)


@triton.jit
def _broken_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
  offsets = tl.arange(0, BLOCK)
  tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.arange(0, BLOCK * 2))  # shape mismatch


if _HAS_MULTICAST:

  @gluon.jit
  def _multicast_copy_kernel(x_desc, y_ptr, N: gl.constexpr):
    """y = x, one (BM, N) row tile per 2-CTA cluster: TMA multicasts the tile into both CTAs' shared memory (the
      descriptor's layout shares it: cga_layout [[0, 0]]), then each CTA stores its half of the rows."""
    BM: gl.constexpr = x_desc.block_shape[0]
    tile = gl.allocate_shared_memory(x_desc.dtype, x_desc.block_shape, x_desc.layout)
    ready = mbarrier.allocate_mbarrier()
    mbarrier.init(ready, count=1)
    mbarrier.expect(ready, x_desc.nbytes_per_cta)
    row = gl.program_id(0) * BM  # program ids count clusters
    tma.async_load(x_desc, [row, 0], ready, tile, multicast=True)
    mbarrier.wait(ready, phase=0, deps=[tile])
    halves: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[1, 0]])
    rows = row + gl.arange(0, BM, layout=gl.SliceLayout(1, halves))
    cols = gl.arange(0, N, layout=gl.SliceLayout(0, halves))
    gl.store(y_ptr + rows[:, None] * N + cols[None, :], tile.load(halves))


def multicast_copy(x, bm=128):
  """x (M, N) fp16 through _multicast_copy_kernel: M a multiple of bm, clusters of 2 CTAs."""
  layout = gl.NVMMASharedLayout.get_default_for([bm, x.shape[1]], gl.float16, cga_layout=[[0, 0]])
  return ffi.triton_call(ffi.TensorDescriptor(x, (bm, x.shape[1]), layout=layout), kernel=_multicast_copy_kernel,
                         out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), grid=(x.shape[0] // bm,), num_ctas=2,
                         N=x.shape[1])


# --------------------------------------------------------------------------------------------------------------
# Calls


def vector_add(x, y, block=64):
  return ffi.triton_call(x,
                         y,
                         x.size,
                         kernel=_add_kernel,
                         out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                         grid=lambda meta: (triton.cdiv(x.size, meta["BLOCK"]),),
                         BLOCK=block)


def accumulate_mod(x, block):
  """out (block,): out[i % block] sums x[i]; the kernel atomically adds, so out must start zeroed."""
  return ffi.triton_call(x,
                         x.size,
                         kernel=_accumulate_kernel,
                         grid=(triton.cdiv(x.size, block),),
                         BLOCK=block,
                         out_shape=jax.ShapeDtypeStruct((block,), x.dtype),
                         zeroed_outputs=(0,))


def zeroed_scale_prefix(y, written, block):
  """y's buffer, zeroed, then its first `written` elements doubled in place: zeros if the zeroing comes first."""
  return ffi.triton_call(y,
                         written,
                         2.0,
                         kernel=_scale_prefix_inplace_kernel,
                         grid=(triton.cdiv(written, block),),
                         BLOCK=block,
                         out_shape=jax.ShapeDtypeStruct(y.shape, y.dtype),
                         input_output_aliases={0: 0},
                         zeroed_outputs=(0,))


def tuple_scale(xs, block=64):
  """[(p + 1) * xs[p]] for 1-D xs of one size: the arrays and the outputs as tuple params."""
  n = xs[0].size
  out, = ffi.triton_call(tuple(xs), n, kernel=_tuple_scale_kernel, grid=(len(xs),),
                         out_shape=[tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in xs)], P=len(xs), BLOCK=block)
  return out


def _check_tuple_scale(xs, outs):
  assert len(outs) == len(xs)
  for p, (x, out) in enumerate(zip(xs, outs)):
    np.testing.assert_allclose(np.asarray(out), (p + 1) * np.asarray(x, np.float64), rtol=1e-6)


def _launch_matmul(kernel, a, b, a_arg, b_arg, bm, bn, bk):
  """c (M, N) = a (M, K) @ b (K, N) by `kernel`, which takes a_arg and b_arg (the arrays or descriptors)."""
  (m, k), (_, n) = a.shape, b.shape
  return ffi.triton_call(a_arg,
                         b_arg,
                         m,
                         n,
                         k,
                         kernel=kernel,
                         out_shape=jax.ShapeDtypeStruct((m, n), a.dtype),
                         grid=(triton.cdiv(m, bm), triton.cdiv(n, bn)),
                         BM=bm,
                         BN=bn,
                         BK=bk)


def matmul(a, b, bm=16, bn=16, bk=16):
  return _launch_matmul(_matmul_kernel, a, b, a, b, bm, bn, bk)


def descriptor_matmul(a, b, bm=16, bn=16, bk=16):
  return _launch_matmul(_descriptor_matmul_kernel, a, b, ffi.TensorDescriptor(a, (bm, bk)),
                        ffi.TensorDescriptor(b, (bk, bn)), bm, bn, bk)


def descriptor_tile_copy(x, padding, bm=16, bn=8):
  rows, cols = triton.cdiv(x.shape[0], bm) * bm, triton.cdiv(x.shape[1], bn) * bn
  return ffi.triton_call(ffi.TensorDescriptor(x, (bm, bn), padding),
                         cols,
                         kernel=_descriptor_tile_copy_kernel,
                         out_shape=jax.ShapeDtypeStruct((rows, cols), x.dtype),
                         grid=(rows // bm, cols // bn),
                         BM=bm,
                         BN=bn)


def _check_tile_copy(test, x, got, padding):
  m, n = x.shape
  np.testing.assert_array_equal(got[:m, :n], x)
  outside = np.concatenate([got[m:].ravel(), got[:m, n:].ravel()])
  test.assertNotEmpty(outside)
  if padding == "zero":
    np.testing.assert_array_equal(outside, 0)  # also proves the (NaN-poisoned) padding was written
  else:
    test.assertTrue(np.isnan(outside).all())


@jax.custom_vjp
def differentiable_matmul(a, b):
  return matmul(a, b)


def _matmul_fwd(a, b):
  return matmul(a, b), (a, b)


def _matmul_bwd(residuals, g):
  a, b = residuals
  return matmul(g, b.T), matmul(a.T, g)


differentiable_matmul.defvjp(_matmul_fwd, _matmul_bwd)


def _random(rng, shape, dtype=np.float32):
  return rng.standard_normal(shape).astype(dtype)


def _unescape_mlir_string(text: str) -> bytes:
  out, i = bytearray(), 0
  while i < len(text):
    if text[i] == "\\" and text[i + 1] == "\\":
      out.append(ord("\\"))
      i += 2
    elif text[i] == "\\":
      out.append(int(text[i + 1:i + 3], 16))
      i += 3
    else:
      out += text[i].encode()
      i += 1
  return bytes(out)


def _custom_call_protos(stablehlo: str) -> list:
  """The decompressed TritonAnyKernelCall protos of every triton_kernel_call_ffi in a StableHLO module."""
  return [
      zlib.decompress(_unescape_mlir_string(m.group(1))) for line in stablehlo.splitlines()
      if "@triton_kernel_call_ffi" in line for m in [re.search(r'opaque = "((?:[^"\\]|\\.)*)"', line)]
  ]


def _proto_fields(message: bytes) -> dict:
  """{field number: [values]} of one serialized protobuf message: varints as ints, length-delimited fields as bytes
    (a test-side reader, independent of the encoder in ffi/_jaxlib.py)."""
  fields, i = {}, 0

  def varint():
    nonlocal i
    value = shift = 0
    while True:
      byte = message[i]
      i += 1
      value |= (byte & 0x7F) << shift
      shift += 7
      if byte < 0x80:
        return value

  while i < len(message):
    key = varint()
    if key & 7 == 0:
      value = varint()
    elif key & 7 == 2:
      size = varint()
      value, i = message[i:i + size], i + size
    else:
      width = {1: 8, 5: 4}[key & 7]
      value, i = message[i:i + width], i + width
    fields.setdefault(key >> 3, []).append(value)
  return fields


def _kernel_fields(call_proto: bytes) -> dict:
  """The TritonKernel fields of a serialized TritonAnyKernelCall, repeated embedded messages merged (protobuf
    semantics: the concatenation of two encodings of a message is their merge)."""
  kernel_call = b"".join(_proto_fields(call_proto)[1])
  return _proto_fields(b"".join(_proto_fields(kernel_call)[1]))


def _ptx_version_of(ptx: str) -> int:
  major, minor = re.search(r"^\.version (\d+)\.(\d)$", ptx, re.M).groups()
  return int(major) * 10 + int(minor)


def _lower_for(platform, fn, *args):
  """StableHLO of fn lowered for `platform`; a fresh wrapper, since jax caches lowerings per function and
    JGMM_TARGET is read at lowering time."""
  return jax.jit(lambda *a: fn(*a)).trace(*args).lower(lowering_platforms=(platform,)).as_text()


# --------------------------------------------------------------------------------------------------------------
# CPU: Triton interpreter


class InterpreterTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.enter_context(mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}))
    self.rng = np.random.default_rng(self.id().__hash__() % 2**32)

  def _cpu(self, *arrays):
    return [jax.device_put(a, _CPU) for a in arrays]

  @parameterized.parameters(1, 3)
  def test_tuple_params(self, count):
    xs = [_random(self.rng, 50) for _ in range(count)]
    _check_tuple_scale(xs, jax.jit(lambda *a: tuple_scale(a))(*self._cpu(*xs)))

  def test_tuple_arguments_are_checked(self):
    x = jnp.zeros(16)
    with self.assertRaisesRegex(TypeError, "argument 0 must be a non-empty tuple of jax arrays"):
      ffi.triton_call((), 16, kernel=_tuple_scale_kernel, grid=(1,), out_shape=[(x,)], P=1, BLOCK=16)
    with self.assertRaisesRegex(ValueError, "a tuple of outputs in out_shape must not be empty"):
      ffi.triton_call((x,), 16, kernel=_tuple_scale_kernel, grid=(1,), out_shape=[()], P=1, BLOCK=16)
    with self.assertRaisesRegex(TypeError, "the kernel has 3 non-constexpr params, but 2 args and 2 outputs"):
      ffi.triton_call((x,), 16, kernel=_tuple_scale_kernel, grid=(1,), out_shape=[(x,), x], P=1, BLOCK=16)

  @parameterized.parameters(1, 63, 64, 200)
  def test_vector_add(self, n):
    x, y = _random(self.rng, n), _random(self.rng, n)
    got = jax.jit(vector_add)(*self._cpu(x, y))
    np.testing.assert_allclose(np.asarray(got), x.astype(np.float64) + y, rtol=1e-6)

  @parameterized.parameters((37, 50, 29), (16, 16, 16), (1, 5, 3))
  def test_matmul(self, m, k, n):
    a, b = _random(self.rng, (m, k)), _random(self.rng, (k, n))
    got = jax.jit(matmul)(*self._cpu(a, b))
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

  @parameterized.parameters((37, 52, 28), (16, 16, 16), (5, 4, 8))
  def test_host_tensor_descriptor_matmul(self, m, k, n):
    a, b = _random(self.rng, (m, k)), _random(self.rng, (k, n))
    got = jax.jit(descriptor_matmul)(*self._cpu(a, b))
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

  @parameterized.parameters("zero", "nan")
  def test_host_tensor_descriptor_padding(self, padding):
    x = _random(self.rng, (37, 20))
    got = np.asarray(jax.jit(lambda x: descriptor_tile_copy(x, padding))(*self._cpu(x)))
    _check_tile_copy(self, x, got, padding)

  def test_vmap_loops_over_batch(self):
    x, y = _random(self.rng, (3, 70)), _random(self.rng, 70)
    got = jax.jit(jax.vmap(vector_add, in_axes=(0, None)))(*self._cpu(x, y))
    np.testing.assert_allclose(np.asarray(got), x.astype(np.float64) + y, rtol=1e-6)

  def test_grad_through_custom_vjp(self):
    a, b, w = _random(self.rng, (9, 20)), _random(self.rng, (20, 7)), _random(self.rng, (9, 7))
    loss = lambda a, b, w: jnp.sum(differentiable_matmul(a, b) * w)
    da, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(*self._cpu(a, b, w))
    np.testing.assert_allclose(np.asarray(da), w.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(db), a.astype(np.float64).T @ w, rtol=1e-4, atol=1e-4)

  def test_unwritten_outputs_are_poisoned_and_zeroed_outputs_are_zero(self):
    n, written = 100, 37
    x = _random(self.rng, n)
    outs = jax.jit(lambda x: ffi.triton_call(x,
                                             written,
                                             kernel=_two_outputs_prefix_kernel,
                                             zeroed_outputs=(0,),
                                             grid=(2,),
                                             BLOCK=64,
                                             out_shape=[
                                                 jax.ShapeDtypeStruct((n,), jnp.float32),
                                                 jax.ShapeDtypeStruct((n,), jnp.float32),
                                                 jax.ShapeDtypeStruct((n,), jnp.int32)
                                             ]))(*self._cpu(x))
    zeroed, poisoned, index = map(np.asarray, outs)
    np.testing.assert_allclose(zeroed[:written], x[:written] + 1, rtol=1e-6)
    np.testing.assert_allclose(poisoned[:written], x[:written] + 1, rtol=1e-6)
    np.testing.assert_array_equal(index[:written], np.arange(written))
    np.testing.assert_array_equal(zeroed[written:], 0)
    self.assertTrue(np.isnan(poisoned[written:]).all())
    np.testing.assert_array_equal(index[written:], np.iinfo(np.int32).min)

  @parameterized.named_parameters(("output_param_appended", True), ("written_through_input", False))
  def test_aliased_output_keeps_unwritten_elements(self, appended):
    n, written = 90, 41
    x = _random(self.rng, n)

    kernel = _scale_prefix_kernel if appended else _scale_prefix_inplace_kernel

    def scale_prefix(x):
      return ffi.triton_call(x, written, 3.0, kernel=kernel, grid=(2,), BLOCK=64,
                             out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), input_output_aliases={0: 0})

    got = np.asarray(jax.jit(scale_prefix)(*self._cpu(x)))
    np.testing.assert_allclose(got[:written], 3.0 * x[:written].astype(np.float64), rtol=1e-6)
    np.testing.assert_array_equal(got[written:], x[written:])

  def test_aliased_and_zeroed_output(self):
    n, written = 90, 41
    x = _random(self.rng, n)
    got = np.asarray(jax.jit(lambda x: accumulate_mod(x, 64))(*self._cpu(x)))
    expected = np.zeros(64)
    np.add.at(expected, np.arange(n) % 64, x.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    y = _random(self.rng, n)
    got = np.asarray(jax.jit(lambda y: zeroed_scale_prefix(y, written, 64))(*self._cpu(y)))
    np.testing.assert_array_equal(got, 0)  # zeroed before the kernel read it: 2 * 0 everywhere

  def test_unused_call_is_removed(self):
    x = _random(self.rng, 8)
    jaxpr = jax.make_jaxpr(lambda x: (vector_add(x, x), x * 2)[1])(x)
    from jax._src.interpreters import partial_eval as pe
    dced, _ = pe.dce_jaxpr(jaxpr.jaxpr, [True])
    self.assertEmpty([e for e in dced.eqns if e.primitive is ffi._call.triton_call_p])
    self.assertLen([e for e in jaxpr.jaxpr.eqns if e.primitive is ffi._call.triton_call_p], 1)

  def test_cpu_without_interpreter_is_an_error(self):
    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "0"}):
      x = self._cpu(_random(self.rng, 8))[0]
      with self.assertRaisesRegex(RuntimeError, "need a GPU platform.*TRITON_INTERPRET=1"):
        jax.jit(vector_add)(x, x)

  def test_bad_arguments_are_rejected_at_trace_time(self):
    x = jnp.ones(8, jnp.float32)
    out = jax.ShapeDtypeStruct((8,), jnp.float32)
    with self.assertRaisesRegex(TypeError, "4 non-constexpr params, but 2 args and 1 outputs"):
      ffi.triton_call(x, x, kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8)
    with self.assertRaisesRegex(TypeError, "not constexpr params"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8, BLOK=8)
    with self.assertRaisesRegex(TypeError, "missing constexpr param 'BLOCK'"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1,))
    with self.assertRaisesRegex(ValueError, "grid must be 1-3"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1, 1, 1, 1), BLOCK=8)
    with self.assertRaisesRegex(ValueError, "exceeds the launch limits"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1, 70000), BLOCK=8)
    with self.assertRaisesRegex(ValueError, "must index an array argument"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8, input_output_aliases={2: 0})
    with self.assertRaisesRegex(ValueError, "zeroed_outputs"):
      ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8, zeroed_outputs=(1,))
    with self.assertRaisesRegex(TypeError, "@triton.jit function"):
      ffi.triton_call(x, x, 8, kernel=lambda *a: None, out_shape=out, grid=(1,))
    with self.assertRaisesRegex(TypeError, "argument 2 must be a jax array"):
      ffi.triton_call(x, x, "8", kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8)
    for maxnreg in (16, 256, 128.0):
      with self.assertRaisesRegex(ValueError, r"maxnreg must be None or an int in \[24, 255\]"):
        ffi.triton_call(x, x, 8, kernel=_add_kernel, out_shape=out, grid=(1,), BLOCK=8, maxnreg=maxnreg)
    a = jnp.ones((32, 20), jnp.float32)
    call = lambda desc, **kw: ffi.triton_call(desc,
                                              24,
                                              kernel=_descriptor_tile_copy_kernel,
                                              out_shape=jax.ShapeDtypeStruct((32, 24), a.dtype),
                                              grid=(2, 3),
                                              BM=16,
                                              BN=8,
                                              **kw)
    with self.assertRaisesRegex(ValueError, r"argument 0 \(TensorDescriptor\): block_shape must be one power"):
      call(ffi.TensorDescriptor(a, (16, 6)))
    with self.assertRaisesRegex(ValueError, "block_shape must be one power of 2 per dimension"):
      call(ffi.TensorDescriptor(a, (16,)))
    with self.assertRaisesRegex(ValueError, "padding must be 'zero' or 'nan'"):
      call(ffi.TensorDescriptor(a, (16, 8), "inf"))
    with self.assertRaisesRegex(ValueError, "padding='nan' needs a floating-point base"):
      call(ffi.TensorDescriptor(jnp.ones((32, 20), jnp.int32), (16, 8), "nan"))
    with self.assertRaisesRegex(ValueError, "multiple of 16 bytes"):
      call(ffi.TensorDescriptor(jnp.ones((32, 6), jnp.float32), (16, 8)))
    with self.assertRaisesRegex(ValueError, r"dimensions in \[1, 2\*\*31\)"):
      call(ffi.TensorDescriptor(jnp.ones((0, 20), jnp.float32), (16, 8)))
    with self.assertRaisesRegex(TypeError, "base must be a jax array"):
      call(ffi.TensorDescriptor([1.0], (16, 8)))
    with self.assertRaisesRegex(TypeError, "layout must be None or a gluon NVMMASharedLayout"):
      call(ffi.TensorDescriptor(a, (16, 8), layout="swizzle128"))
    with self.assertRaisesRegex(ValueError, "must index an array argument"):
      ffi.triton_call(ffi.TensorDescriptor(a, (16, 8)),
                      24,
                      kernel=_descriptor_tile_copy_kernel,
                      out_shape=a,
                      grid=(2, 3),
                      BM=16,
                      BN=8,
                      input_output_aliases={0: 0})


# --------------------------------------------------------------------------------------------------------------
# CPU: lowering for GPU platforms


@absltest.skipUnless(_jaxlib.has_plugin(), "cross-lowering needs jax's GPU plugin: pip install 'jgmm[cuda]'")
class CrossLoweringTest(parameterized.TestCase):

  def _target(self, text):
    self.enter_context(mock.patch.dict(os.environ, {_compile.TARGET_ENV: text}))

  @parameterized.parameters(90, 80)
  def test_cuda_custom_call_carries_ptx_for_the_target(self, capability):
    self._target(f"cuda:{capability}")
    x = jax.ShapeDtypeStruct((300,), jnp.float32)
    a, b = jax.ShapeDtypeStruct((40, 24), jnp.float32), jax.ShapeDtypeStruct((24, 33), jnp.float32)
    sm = "sm_90a" if capability == 90 else "sm_80"
    for fn, args in [(vector_add, (x, x)), (matmul, (a, b))]:
      text = _lower_for("cuda", fn, *args)
      protos = _custom_call_protos(text)
      self.assertLen(protos, 1, msg=text)
      self.assertIn(f".target {sm}".encode(), protos[0])
    compiled = [c for c in _compile._cache.values() if c.target == _compile.Target("cuda", capability)]
    self.assertNotEmpty(compiled)
    for c in compiled:
      self.assertIn(f".target {sm}", c.asm["ptx"])
      self.assertNotEmpty(c.asm["cubin"])

  def test_multiply_adds_are_fused_whatever_tritons_default(self):
    """Triton 3.9 warns that its default for FP fusion turns to off in 3.10 (TRITON_DEFAULT_FP_FUSION): jgmm asks
    for it, so its kernels keep their FMAs; where Triton has TRITON_FORCE_DISABLE_FP_FUSION, it still turns it off."""
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    call = lambda x: ffi.triton_call(x, kernel=_multiply_add_kernel, out_shape=x, grid=(1,), BLOCK=64)
    cases = [({"TRITON_DEFAULT_FP_FUSION": "0"}, True)]
    if hasattr(triton.knobs.language, "force_disable_fp_fusion"):  # Triton 3.9's override
      cases.append(({"TRITON_FORCE_DISABLE_FP_FUSION": "1"}, False))
    for env, fused in cases:
      _compile._cache.clear()
      with mock.patch.dict(os.environ, env):
        _lower_for("cuda", call, x)
      (compiled,) = [c for k, c in _compile._cache.items() if k[0] is _multiply_add_kernel]
      self.assertEqual("fma.rn.f32" in compiled.asm["ptx"], fused, env)

  @absltest.skipUnless(hasattr(triton.knobs.language, "fp_fusion_enabled"), "Triton < 3.9 has no FP fusion warning")
  def test_no_fp_fusion_warning(self):
    """Every options jgmm hands Triton name FP fusion, so Triton 3.9 never warns a user that its default will
    change (it warns where a compile or parse_options leaves enable_fp_fusion unset)."""
    self._target("cuda:90")
    _compile._cache.clear()
    _compile._triton_ptx_version.cache_clear()
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    call = lambda x: ffi.triton_call(x, kernel=_multiply_add_kernel, out_shape=x, grid=(1,), BLOCK=64)
    with mock.patch.object(triton.knobs.language, "fp_fusion_enabled",
                           wraps=triton.knobs.language.fp_fusion_enabled) as asked:
      _lower_for("cuda", call, x)
    self.assertNotEmpty(asked.call_args_list)
    self.assertEqual({c.args[0] for c in asked.call_args_list}, {True})

  @absltest.skipUnless(_HAS_MULTICAST, "Gluon has TMA multicast from Triton 3.7")
  def test_cluster_launch(self):
    """num_ctas = 2: Triton compiles for clusters of two CTAs (the PTX requires them, TMA multicasts) and the
      custom call asks jaxlib for them (TritonKernel's num_ctas), the grid still counted in clusters."""
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((512, 64), jnp.float16)
    with mock.patch.object(_jaxlib, "serialized_call", wraps=_jaxlib.serialized_call) as serialized:
      text = _lower_for("cuda", multicast_copy, x)
    self.assertIn("triton_kernel_call", text)
    kwargs = serialized.call_args.kwargs
    self.assertEqual((kwargs["num_ctas"], kwargs["grid"]), (2, (4, 1, 1)))
    (compiled,) = [c for k, c in _compile._cache.items() if k[0] is _multicast_copy_kernel]
    self.assertEqual(compiled.num_ctas, 2)
    self.assertIn(".reqnctapercluster 2", compiled.asm["ptx"])
    self.assertIn(".multicast::cluster", compiled.asm["ptx"])

  def test_num_ctas_is_checked(self):
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    for bad in (0, 3, 2.0):
      with self.assertRaisesRegex(ValueError, rf"num_ctas must be an int in \(1, 2, 4, 8, 16\).*got {bad!r}"):
        ffi.triton_call(x, kernel=_multiply_add_kernel, out_shape=x, grid=(1,), num_ctas=bad, BLOCK=64)
    call = lambda x: ffi.triton_call(x, kernel=_multiply_add_kernel, out_shape=x, grid=(1,), num_ctas=2, BLOCK=64)
    with mock.patch.dict(os.environ, {"TRITON_INTERPRET": "1"}), \
        self.assertRaisesRegex(NotImplementedError, r"interpreter has no clusters \(num_ctas=2\)"):
      _lower_for("cpu", call, x)

  def test_specialization_attributes_follow_the_arguments(self):
    self._target("cuda:90")
    for n, marked in [(300, 3), (320, 4)]:  # pointers are 16-byte aligned; n is marked if a multiple of 16
      x = jax.ShapeDtypeStruct((n,), jnp.float32)
      before = set(_compile._cache)
      _lower_for("cuda", lambda x, y: vector_add(x, y, block=32), x, x)
      (key,) = set(_compile._cache) - before
      self.assertEqual(_compile._cache[key].asm["ttir"].count("tt.divisibility = 16"), marked)
    _lower_for("cuda",
               lambda x: ffi.triton_call(x, 1, 2.0, kernel=_scale_prefix_kernel, out_shape=x, grid=(1,), BLOCK=16), x)
    constexprs = [dict(k[2]) for k in _compile._cache if k[0] is _scale_prefix_kernel]
    self.assertIn({"BLOCK": 16, "n_written": 1}, constexprs)  # an int argument equal to 1 is specialized

  def test_tuple_params_are_flattened_and_specialized(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    before = set(_compile._cache)
    text = _lower_for("cuda", lambda *a: tuple_scale(a), x, x, x)
    self.assertLen(_custom_call_protos(text), 1)
    (key,) = set(_compile._cache) - before
    self.assertEqual(dict(key[1])["xs"], ("*fp32",) * 3)
    ptx = _compile._cache[key].asm["ptx"]
    entry = re.search(r"\.entry \w+\((.*?)\)", ptx, re.S).group(1)
    # xs, n, outs: one pointer param per array (Triton's scratch pointers follow)
    self.assertEqual(re.findall(r"\.param \.(\w+)", entry)[:7], ["u64"] * 3 + ["u32"] + ["u64"] * 3)
    self.assertEqual(_compile._cache[key].asm["ttir"].count("tt.divisibility = 16"), 7)  # 6 pointers and n

  def test_aliases_become_xla_output_operand_aliases(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((90,), jnp.float32)
    text = _lower_for(
        "cuda", lambda x: ffi.triton_call(x,
                                          41,
                                          2.0,
                                          kernel=_scale_prefix_inplace_kernel,
                                          grid=(1,),
                                          BLOCK=128,
                                          out_shape=x,
                                          input_output_aliases={0: 0},
                                          zeroed_outputs=(0,)), x)
    self.assertIn("output_operand_aliases", text)
    self.assertLen(_custom_call_protos(text), 1)

  def test_unused_call_is_not_lowered(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((64,), jnp.float32)
    self.assertIn("triton_kernel_call_ffi", _lower_for("cuda", lambda x: vector_add(x, x) * 2, x))
    self.assertNotIn("triton_kernel_call_ffi", _lower_for("cuda", lambda x: (vector_add(x, x), x * 2)[1], x))

  def test_compile_failure_names_the_kernel(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((32,), jnp.float32)
    with self.assertRaisesRegex(ffi.KernelCompileError, "_broken_kernel.*cuda:90"):
      _lower_for("cuda", lambda x: ffi.triton_call(x, kernel=_broken_kernel, out_shape=x, grid=(1,), BLOCK=32), x)

  def test_target_must_be_known(self):
    x = jax.ShapeDtypeStruct((32,), jnp.float32)
    with mock.patch.dict(os.environ, {_compile.TARGET_ENV: ""}):
      if not _HAS_GPU:
        with self.assertRaisesRegex(RuntimeError, "JGMM_TARGET"):
          _lower_for("cuda", lambda x: vector_add(x, x), x)
    self._target("cuda:sm90")
    with self.assertRaisesRegex(ValueError, "expected 'cuda:<compute capability>'"):
      _lower_for("cuda", lambda x: vector_add(x, x), x)

  def _lower_new(self, fn, *args):
    """(the custom call protos, the kernels compiled) of lowering fn for cuda."""
    before = set(_compile._cache)
    protos = _custom_call_protos(_lower_for("cuda", fn, *args))
    return protos, [_compile._cache[k] for k in set(_compile._cache) - before]

  def test_ptx_version_is_capped_for_the_ptxas_jaxlib_runs(self):
    # jax's CUDA 13 plugin: jaxlib's ptxas may be CUDA 13.0's, which reads PTX ISA 9.0 at most (Triton 3.9 alone
    # would write 9.4; Triton 3.6 writes 8.7).
    self.assertEqual(_jaxlib.plugin_cuda_major(), 13)
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((272,), jnp.float32)
    (proto,), (compiled,) = self._lower_new(lambda x, y: vector_add(x, y, block=128), x, x)
    expected = min(_compile._triton_ptx_version(_compile.Target("cuda", 90)), 90)
    self.assertEqual(_ptx_version_of(compiled.asm["ptx"]), expected)
    self.assertEqual(_ptx_version_of(_kernel_fields(proto)[4][0].decode()), expected)
    self.assertNotEmpty(compiled.asm["cubin"])  # Triton's ptxas assembled it

  def test_ptx_version_env(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((272,), jnp.float32)
    with mock.patch.dict(os.environ, {_compile.PTX_VERSION_ENV: "8.5"}):
      (proto,), (compiled,) = self._lower_new(lambda x, y: vector_add(x, y, block=256), x, x)
    self.assertEqual(_ptx_version_of(compiled.asm["ptx"]), 85)
    self.assertIn(b".version 8.5\n", proto)
    for text, message in [("90", "expected a PTX ISA version such as 9.0"), ("9.10", "expected a PTX ISA version"),
                          ("7.8", r"cannot target cuda:90: it needs PTX 8.0 or newer")]:
      with mock.patch.dict(os.environ, {_compile.PTX_VERSION_ENV: text}):
        with self.assertRaisesRegex(ValueError, f"JGMM_PTX_VERSION='{re.escape(text)}'.*{message}"):
          _lower_for("cuda", vector_add, x, x)
    with mock.patch.dict(os.environ, {_compile.PTX_VERSION_ENV: "9.9"}):  # newer than Triton's ptxas reads
      with self.assertRaisesRegex(ffi.KernelCompileError, r"_add_kernel.*PTX 9\.9 \(set JGMM_PTX_VERSION"):
        _lower_for("cuda", lambda x, y: vector_add(x, y, block=512), x, x)

  @parameterized.parameters(((0, 10, 2), "1", False), ((0, 11, 1), "1", True), ((0, 11, 1), "0", False))
  def test_cubin_rides_as_the_module_image(self, jaxlib_version, cubin_env, carried):
    self._target("cuda:90")
    a, b = jax.ShapeDtypeStruct((40, 24), jnp.float32), jax.ShapeDtypeStruct((24, 33), jnp.float32)
    with mock.patch.object(_jaxlib, "_jaxlib_version", jaxlib_version), \
        mock.patch.dict(os.environ, {_jaxlib.CUBIN_ENV: cubin_env}):
      _compile._cache.clear()
      (proto,), (compiled,) = self._lower_new(matmul, a, b)
    kernel = _kernel_fields(proto)
    self.assertEqual(kernel[4], [compiled.asm["ptx"].encode()])  # the PTX always rides along (jaxlib's cache key)
    self.assertEqual(kernel[1], [compiled.name.encode()])
    if not carried:
      self.assertNotIn(11, kernel)
      return
    (image,) = kernel[11]
    image = _proto_fields(image)
    self.assertEqual(image[1], [compiled.asm["cubin"]])
    self.assertEqual(image[2], [compiled.name.encode()])
    self.assertEqual(image[3], [compiled.shared_mem_bytes])
    self.assertEqual(kernel[3], [compiled.shared_mem_bytes])
    # jaxlib's own parser reads the merged encoding.
    self.assertEqual(_jaxlib.plugin("cuda").get_serialized_metadata(zlib.compress(proto)), b"")

  @parameterized.parameters(12, 13)
  def test_cubin_only_where_every_driver_of_the_plugin_loads_it(self, cuda_major):
    """A CUDA 12 plugin runs on CUDA 12 drivers, which do not load cubins of a CUDA 13 ptxas (Triton 3.9's for
    sm_90); its PTX is then capped at ISA 8.0 for a CUDA 12 ptxas."""
    self._target("cuda:90")
    triton_ptxas_major = 13 if _compile._triton_ptx_version(_compile.Target("cuda", 90)) >= 90 else 12
    a, b = jax.ShapeDtypeStruct((40, 24), jnp.float32), jax.ShapeDtypeStruct((24, 33), jnp.float32)
    with mock.patch.object(_jaxlib, "_jaxlib_version", (0, 11, 1)), \
        mock.patch.object(_jaxlib, "plugin_cuda_major", return_value=cuda_major):
      _compile._cache.clear()
      (proto,), (compiled,) = self._lower_new(matmul, a, b)
    self.assertEqual(11 in _kernel_fields(proto), triton_ptxas_major <= cuda_major)
    self.assertEqual(_ptx_version_of(compiled.asm["ptx"]) <= 80, cuda_major == 12)

  def test_in_process_cache(self):
    target = _compile.Target("cuda", 90)
    signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "out_ptr": "*fp32", "BLOCK": "constexpr"}
    first = _compile.compile_kernel(_add_kernel, signature, {"BLOCK": 256}, {}, target, 4, 3)
    self.assertIs(_compile.compile_kernel(_add_kernel, signature, {"BLOCK": 256}, {}, target, 4, 3), first)
    self.assertIsNot(_compile.compile_kernel(_add_kernel, signature, {"BLOCK": 256}, {}, target, 8, 3), first)

  def test_global_scratch_kernel(self):
    self._target("cuda:90")
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    fn = lambda x: ffi.triton_call(x, 64, 64, kernel=_descriptor_scale_kernel, out_shape=x, grid=(4, 2), BM=16, BN=32)
    signature = {"x_ptr": "*fp32", "M": "i32", "N": "i32", "out_ptr": "*fp32", "BM": "constexpr", "BN": "constexpr"}
    compiled = _compile.compile_kernel(_descriptor_scale_kernel, signature, {"BM": 16, "BN": 32}, {},
                                       _compile.Target("cuda", 90), 4, 3)
    self.assertGreater(compiled.global_scratch_size, 0)
    # The scratch is one more (XLA-allocated) result of the custom call, one slot per program of the grid.
    per_program = -(-compiled.global_scratch_size // compiled.global_scratch_align) * compiled.global_scratch_align
    (line,) = [l for l in _lower_for("cuda", fn, x).splitlines() if "@triton_kernel_call_ffi" in l]
    self.assertRegex(line, rf"-> \(tensor<64x64xf32>, tensor<{8 * per_program}xui8>\)")

  def test_host_tensor_descriptor_kernel(self):
    self._target("cuda:90")
    a, b = jax.ShapeDtypeStruct((40, 24), jnp.float32), jax.ShapeDtypeStruct((24, 36), jnp.float32)
    if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
      with self.assertRaisesRegex(NotImplementedError,
                                  rf"jaxlib {re.escape(jax.lib.__version__)} has no create_tma_descriptor"):
        _lower_for("cuda", descriptor_matmul, a, b)
      return
    before = set(_compile._cache)
    protos = _custom_call_protos(_lower_for("cuda", descriptor_matmul, a, b))
    self.assertLen(protos, 1)
    (key,) = set(_compile._cache) - before
    compiled = _compile._cache[key]
    self.assertEqual(dict(key[1])["a_desc"], "tensordesc<fp32[16, 16]>")
    self.assertEqual([m["block_size"] for m in compiled.tensordesc_meta], [[16, 16], [16, 16]])
    # The CUtensorMaps are by-value 128-byte params, each followed by its shape (i32) and strides (i64).
    params = re.findall(r"\.param (.*?) _descriptor_matmul_kernel_param_\d+", compiled.asm["ptx"])
    self.assertEqual(params[:10], [".align 64 .b8", ".u32", ".u32", ".u64", ".u64"] * 2)
    self.assertIn(b".target sm_90a", protos[0])
    self.assertIn(compiled.name.encode(), protos[0])

  def test_host_tensor_descriptor_needs_tma(self):
    x = jax.ShapeDtypeStruct((32, 20), jnp.float32)
    message = ("no create_tma_descriptor" if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")) else
               "lowered the kernel's tensor-descriptor params to plain pointers for cuda:80")
    self._target("cuda:80")
    with self.assertRaisesRegex(NotImplementedError, message):
      _lower_for("cuda", lambda x: descriptor_tile_copy(x, "zero"), x)
    self._target("rocm:gfx942")
    with self.assertRaisesRegex(
        NotImplementedError, rf"jaxlib {re.escape(jax.lib.__version__)} builds host-side "
        "TMA descriptors only for NVIDIA GPUs"):
      _lower_for("rocm", lambda x: descriptor_tile_copy(x, "zero"), x)

  @parameterized.parameters("gfx942", "gfx950")
  def test_rocm(self, arch):
    if not _HAS_HIP_BACKEND:
      self.skipTest("this Triton build has no HIP backend")
    target = _compile.Target("rocm", arch)
    signature = {
        "a_ptr": "*fp32",
        "b_ptr": "*fp32",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "c_ptr": "*fp32",
        "BM": "constexpr",
        "BN": "constexpr",
        "BK": "constexpr"
    }
    try:
      compiled = _compile.compile_kernel(_matmul_kernel, signature, {"BM": 32, "BN": 32, "BK": 16}, {}, target, 4, 2)
    except _compile.KernelCompileError as e:
      if "libtriton_amd_codegen" not in str(e):
        raise
      self.skipTest(f"this Triton's HIP backend lacks its code generator library (a trimmed wheel, such as "
                    f"scripts/carry_wheels.sh TRIM=1 makes): {str(e)[-160:]}")
    self.assertRegex(compiled.asm["amdgcn"], rf'\.amdgcn_target "amdg\S*-amd-amdhsa-\S*{arch}"')
    self.assertTrue(os.path.getsize(compiled.binary) > 0)
    self._target(f"rocm:{arch}")
    x = jax.ShapeDtypeStruct((300,), jnp.float32)
    self.assertLen(_custom_call_protos(_lower_for("rocm", vector_add, x, x)), 1)


# --------------------------------------------------------------------------------------------------------------
# GPU


@absltest.skipUnless(_HAS_GPU, "needs a GPU")
class GpuTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    self.rng = np.random.default_rng(self.id().__hash__() % 2**32)

  @absltest.skipUnless(_HAS_MULTICAST, "Gluon has TMA multicast from Triton 3.7")
  def test_cluster_multicast_copy(self):
    """Clusters of two CTAs launched through jaxlib: each stores the half of a tile that TMA multicast into both."""
    x = jnp.asarray(self.rng.standard_normal((512, 64)), jnp.float16)
    np.testing.assert_array_equal(np.asarray(jax.jit(multicast_copy)(x)), np.asarray(x))

  def test_tuple_params(self):
    xs = [_random(self.rng, 50) for _ in range(5)]
    _check_tuple_scale(xs, jax.jit(lambda *a: tuple_scale(a))(*xs))

  @parameterized.parameters(1, 1000, 4099)
  def test_vector_add(self, n):
    x, y = _random(self.rng, n), _random(self.rng, n)
    np.testing.assert_allclose(np.asarray(jax.jit(vector_add)(x, y)), x.astype(np.float64) + y, rtol=1e-6)

  @parameterized.parameters(("1", None, 128), ("0", None, 256), ("0", "8.0", 512))
  def test_binary_paths(self, cubin_env, ptx_version, block):
    """Triton's cubin as the module image (jaxlib >= 0.11.1), or PTX for jaxlib's ptxas, at Triton's capped PTX
      version or at 8.0; one block size per case, so that jaxlib's module cache (keyed on the PTX) cannot hand a
      case another's binary."""
    env = {_jaxlib.CUBIN_ENV: cubin_env, _compile.PTX_VERSION_ENV: ptx_version or ""}
    x, y = _random(self.rng, 777), _random(self.rng, 777)
    with mock.patch.dict(os.environ, env):
      out = jax.jit(lambda x, y: vector_add(x, y, block=block))(x, y)
    np.testing.assert_allclose(np.asarray(out), x.astype(np.float64) + y, rtol=1e-6)

  @parameterized.parameters((37, 50, 29), (128, 64, 96))
  def test_matmul(self, m, k, n):
    a, b = _random(self.rng, (m, k)), _random(self.rng, (k, n))
    got = jax.jit(lambda a, b: matmul(a, b, 32, 32, 16))(a, b)
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

  def test_vmap_and_grad(self):
    a, b, w = _random(self.rng, (3, 33, 20)), _random(self.rng, (20, 17)), _random(self.rng, (3, 33, 17))
    got = jax.jit(jax.vmap(matmul, in_axes=(0, None)))(a, b)
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    loss = lambda a, b, w: jnp.sum(jax.vmap(differentiable_matmul, in_axes=(0, None))(a, b) * w)
    da, db = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b, w)
    np.testing.assert_allclose(np.asarray(da), w.astype(np.float64) @ b.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(db), np.einsum("bmk,bmn->kn", a.astype(np.float64), w), rtol=1e-4, atol=1e-4)

  @parameterized.named_parameters(("output_param_appended", True), ("written_through_input", False))
  def test_aliased_output_keeps_unwritten_elements(self, appended):
    n, written = 3000, 1234
    x = _random(self.rng, n)
    x[-5:] = np.nan  # poison: must come through untouched
    kernel = _scale_prefix_kernel if appended else _scale_prefix_inplace_kernel
    got = np.asarray(
        jax.jit(lambda x: ffi.triton_call(x,
                                          written,
                                          3.0,
                                          kernel=kernel,
                                          grid=(triton.cdiv(written, 256),),
                                          BLOCK=256,
                                          out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                          input_output_aliases={0: 0}),
                donate_argnums=0)(jnp.asarray(x)))
    np.testing.assert_allclose(got[:written], 3.0 * x[:written].astype(np.float64), rtol=1e-6)
    np.testing.assert_array_equal(got[written:], x[written:])

  def test_zeroed_outputs(self):
    n = 5000
    for _ in range(3):  # leave NaN garbage in freed device memory the outputs may reuse
      jax.block_until_ready(jnp.full((4096,), jnp.nan) + 1).delete()
    x = _random(self.rng, n)
    got = np.asarray(jax.jit(lambda x: accumulate_mod(x, 128))(x))
    expected = np.zeros(128)
    np.add.at(expected, np.arange(n) % 128, x.astype(np.float64))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    y = np.full(1000, np.nan, np.float32)  # poisoned aliased buffer, zeroed before the kernel reads it
    got = np.asarray(jax.jit(lambda y: zeroed_scale_prefix(y, 400, 128))(y))
    np.testing.assert_array_equal(got, 0)

  def test_global_scratch_kernel(self):
    if _compile.device_target("cuda", jax.devices()[0]).arch < 90:
      self.skipTest("device-side tensor descriptors need sm_90+")
    x = _random(self.rng, (64, 96))
    scale = lambda x: ffi.triton_call(x,
                                      64,
                                      96,
                                      kernel=_descriptor_scale_kernel,
                                      out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      grid=(4, 3),
                                      BM=16,
                                      BN=32)
    np.testing.assert_array_equal(np.asarray(jax.jit(scale)(x)), 2 * x)
    # Several scratch kernels and XLA ops in one program, which XLA captures into a command buffer (CUDA
    # graph): jaxlib's launch-time scratch allocation could not be captured; the XLA-allocated one is.
    chain = jax.jit(lambda x: scale(scale(x) + 1.0) * scale(x - 1.0))
    for _ in range(3):
      np.testing.assert_array_equal(np.asarray(chain(x)), (2 * (2 * x + 1)) * (2 * (x - 1)))

  def _skip_unless_tma(self):
    if not _jaxlib.supports_tma_descriptors(_jaxlib.plugin("cuda")):
      self.skipTest("this jaxlib cannot build host-side TMA descriptors")
    if _compile.device_target("cuda", jax.devices()[0]).arch < 90:
      self.skipTest("host-side TMA descriptors need sm_90+")

  @parameterized.parameters((37, 52, 28), (128, 64, 96))
  def test_host_tensor_descriptor_matmul(self, m, k, n):
    self._skip_unless_tma()
    a, b = _random(self.rng, (m, k)), _random(self.rng, (k, n))
    got = jax.jit(descriptor_matmul)(a, b)
    np.testing.assert_allclose(np.asarray(got), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)

  @parameterized.parameters("zero", "nan")
  def test_host_tensor_descriptor_padding(self, padding):
    self._skip_unless_tma()
    for _ in range(3):  # leave NaN garbage in freed device memory the output may reuse
      jax.block_until_ready(jnp.full((4096,), jnp.nan) + 1).delete()
    x = _random(self.rng, (37, 20))
    _check_tile_copy(self, x, np.asarray(jax.jit(lambda x: descriptor_tile_copy(x, padding))(x)), padding)

  def test_compile_failure_is_an_exception(self):
    x = jnp.ones(32, jnp.float32)
    with self.assertRaisesRegex(ffi.KernelCompileError, "_broken_kernel"):
      jax.jit(lambda x: ffi.triton_call(x, kernel=_broken_kernel, out_shape=x, grid=(1,), BLOCK=32))(x)
    np.testing.assert_array_equal(np.asarray(jax.jit(vector_add)(x, x)), 2)  # the process goes on


if __name__ == "__main__":
  absltest.main()
