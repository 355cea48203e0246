"""Run @triton.jit kernels under Triton's CPU interpreter on host numpy arrays (no GPU, no torch)."""

import contextlib
import threading

import numpy as np
from triton.runtime import interpreter as _interpreter
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

from jgmm.ffi import _dtypes

_LOCK = threading.Lock()  # the interpreter patches triton.language globally: one kernel at a time


class _HostPointer:
  """What the interpreter needs from a pointer argument: its address and its Triton element type."""

  def __init__(self, array: np.ndarray):
    self.dtype = _dtypes.triton_dtype(array.dtype)
    self._address = array.ctypes.data

  def data_ptr(self) -> int:
    return self._address


def host_tensor_descriptor(array: np.ndarray, block_shape: tuple, padding: str) -> TensorDescriptor:
  """Triton's host TensorDescriptor over a whole C-contiguous array (which the caller keeps alive)."""
  strides = [int(np.prod(array.shape[d + 1:])) for d in range(array.ndim)]
  # Triton checks padding="nan" against torch's dtype.is_floating_point, which a Triton dtype lacks: the
  # descriptor is built with zero padding, then given the caller's (whose dtype triton_call has checked).
  descriptor = TensorDescriptor(_HostPointer(array), list(array.shape), strides, list(block_shape))
  descriptor.padding = padding
  return descriptor


class _InPlaceGridExecutor(_interpreter.GridExecutor):
  """GridExecutor whose arguments already are host memory: no torch storage copy in or out."""

  def _init_args_hst(self, args_dev, kwargs):
    return args_dev, kwargs

  def _restore_args_dev(self, args_dev, args_hst, kwargs, kwargs_hst):
    pass


def _interpreted(kernel) -> "_interpreter.InterpretedFunction":
  if isinstance(kernel, _interpreter.InterpretedFunction):
    return kernel
  if isinstance(kernel, JITFunction):
    cached = getattr(kernel, "_jgmm_interpreted", None)
    if cached is None:
      cached = _interpreter.InterpretedFunction(kernel.fn)
      kernel._jgmm_interpreted = cached
    return cached
  raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")


def _call_interpreted(helper: JITFunction, *args, **kwargs):
  """A call from an interpreted kernel into another @triton.jit function (its own or triton.language's)."""
  scope = _interpreter._patch_lang(helper.fn)  # the helper's module may see triton.language differently
  try:
    return _interpreted(helper).rewrite()(*args, **kwargs)
  finally:
    scope.restore()


_original_patch_lang_tensor = _interpreter._patch_lang_tensor


def _patch_lang_tensor(tensor, scope) -> None:
  """Triton 3.6's interpreter takes int() of a shape-(1,) array for a scalar's __index__ (`range(0, K, BK)`),
    which numpy >= 2.4 refuses; read the one element instead."""
  _original_patch_lang_tensor(tensor, scope)
  scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))


@contextlib.contextmanager
def _interpreter_patched():
  """Calls from the kernel into other @triton.jit functions run interpreted too; scalars index on numpy 2.4."""
  original_call = JITFunction.__call__
  JITFunction.__call__ = _call_interpreted
  _interpreter._patch_lang_tensor = _patch_lang_tensor
  try:
    yield
  finally:
    JITFunction.__call__ = original_call
    _interpreter._patch_lang_tensor = _original_patch_lang_tensor


def _host_pointer(array: np.ndarray, kernel_name: str) -> _HostPointer:
  if not array.flags.c_contiguous or not array.flags.writeable:
    raise ValueError(f"{kernel_name}: array arguments must be C-contiguous and writeable")
  return _HostPointer(array)


def run_interpreted(kernel, grid: tuple, args: list, constexprs: dict) -> None:
  """Runs a @triton.jit kernel under Triton's interpreter on host numpy arrays, in place.

    kernel: a @triton.jit function (decorated with or without TRITON_INTERPRET=1).
    grid: tuple of 1-3 ints, the number of programs per axis.
    args: numpy arrays (pointer params, C-contiguous, mutated in place), tuples of them (tuple params), Triton
      TensorDescriptors from host_tensor_descriptor (tensor-descriptor params) and python int/float/bool scalars,
      in positional order of the kernel's non-constexpr params.
    constexprs: the kernel's tl.constexpr params by name (num_warps/num_stages are not passed).
    """
  function = _interpreted(kernel)
  grid = tuple(int(g) for g in grid)
  if not 1 <= len(grid) <= 3:
    raise ValueError(f"grid must have 1 to 3 dimensions, got {grid}")
  if any(g == 0 for g in grid):
    return
  pointers = []
  for arg in args:
    if isinstance(arg, np.ndarray):
      pointers.append(_host_pointer(arg, function.__name__))
    elif isinstance(arg, tuple) and all(isinstance(x, np.ndarray) for x in arg):
      pointers.append(tuple(_host_pointer(x, function.__name__) for x in arg))
    elif isinstance(arg, TensorDescriptor):
      pointers.append(arg)
    elif isinstance(arg, (bool, int, float, np.integer, np.floating, np.bool_)):
      pointers.append(arg.item() if isinstance(arg, np.generic) else arg)
    else:
      raise TypeError(f"{function.__name__}: unsupported argument of type {type(arg).__name__}")
  # Under the lock too: rewriting parses the kernel's source, and concurrent ast.parse calls from the device threads
  # of a multi-device CPU computation failed ("AST constructor recursion depth mismatch"), leaving the other devices
  # waiting in their next collective until XLA aborted the process.
  with _LOCK, _interpreter_patched():
    executor = _InPlaceGridExecutor(function.rewrite(), function.arg_names, grid, function.pre_run_hooks)
    executor(*pointers, **constexprs)
  # Keep the arrays alive until the kernel is done with their addresses.
  del pointers
