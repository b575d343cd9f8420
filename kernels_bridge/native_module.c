/* The compiled helpers' module: empty, so that an import of the built file (as tools that walk
   the package do) works. Their functions (hot_buffer_lru.c, fp8_unpack.c) are called through
   ctypes by kernels_bridge/native.py. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "The bridge's C helpers, called through ctypes (kernels_bridge.native).",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
