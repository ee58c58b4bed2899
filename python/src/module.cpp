// fogo._C: the C++ optimizers behind fogo.FOGO and fogo.Muon (python/fogo/optim.py), and the
// lists and steps that the Python package takes from C++ rather than keeping copies of. The
// parts: bound.h (the bound optimizer), traits.h and convert.h (options and state between
// Python and C++), archive.h (checkpoints), and the bind_*.cpp files (bindings.h).
#include <torch/extension.h>

#include <exception>

#include "bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "fogo's C++ optimizers (use fogo.FOGO and fogo.Muon)";

  // C++ errors as Python exceptions with the C++ message (without LibTorch's backtrace).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::TypeError& e) {
      PyErr_SetString(PyExc_TypeError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  fogo_py::bind_optimizers(m);
  fogo_py::bind_muon(m);
  fogo_py::bind_lists(m);
  fogo_py::bind_nonfinite(m);
  m.def("cuda_kernels", [] {
#ifdef FOGO_WITH_CUDA
    return true;
#else
    return false;
#endif
  });
}
