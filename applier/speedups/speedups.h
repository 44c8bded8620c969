/*
 * What the source files of applier.speedups._speedups share (one extension
 * module built from several files: see module.c for the list of functions
 * and which file holds each).
 *
 * Across files, names carry the spd_ prefix (they are not static); helpers
 * small enough to inline are static inline here.
 */
#ifndef APPLIER_SPEEDUPS_H
#define APPLIER_SPEEDUPS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* A big-endian uint32 at p, as the protocol sends every length. */
static inline uint32_t
read_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The bytes of a bytes-like argument (bytes, bytearray, memoryview: what the
 * Python twins index and slice alike): bytes read in place, any other through a
 * buffer view, which holds a reference to it and keeps a bytearray from being
 * resized. */
typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    int has_view;
    Py_buffer view;
} SpdBytes;

/* 0, or -1 with an exception set (TypeError, naming `name`, for a non-bytes-like). */
static inline int
spd_bytes_open(SpdBytes *b, PyObject *obj, const char *name)
{
    b->has_view = 0;
    if (PyBytes_Check(obj)) {
        b->buf = (const unsigned char *)PyBytes_AS_STRING(obj);
        b->len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (!PyObject_CheckBuffer(obj)) {
        PyErr_Format(PyExc_TypeError, "%s: data must be bytes-like, not %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (PyObject_GetBuffer(obj, &b->view, PyBUF_SIMPLE) < 0)
        return -1;
    b->has_view = 1;
    b->buf = (const unsigned char *)b->view.buf;
    b->len = b->view.len;
    return 0;
}

static inline void
spd_bytes_close(SpdBytes *b)
{
    if (b->has_view) {
        b->has_view = 0;
        PyBuffer_Release(&b->view);
    }
}

/* Hidden from the .so's dynamic symbols: as when the module was one file,
 * PyInit__speedups is all it exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* tuples.c: TupleData reading. */
int spd_data_pos_args(PyObject *const *args, Py_ssize_t nargs, const char *name, SpdBytes *data,
                      Py_ssize_t *pos);
PyObject *spd_tuple_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_read_tuple(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, PyObject **kinds,
                   PyObject **values, Py_ssize_t *end);
int spd_tuples_init(void);

/* copyrun.c: COPY framing. */
PyObject *spd_copy_text_row(PyObject *module, PyObject *values);
PyObject *spd_copy_binary_row(PyObject *module, PyObject *values);
PyObject *spd_tuple_text_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *spd_tuple_text_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_copyframe_init(void);

/* takeloop.c: the stream client's read loop. */
PyObject *spd_take_xlog(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* readahead.c: the read-ahead's fill. */
PyObject *spd_fill_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* dispatch.c: the apply worker's loop over a batch. */
PyObject *spd_dispatch_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern PyTypeObject spd_flag_type;
int spd_dispatch_init(void);

/* mergelane.c: the merge lane's loop. */
PyObject *spd_hold_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* decoder.c: transaction and row messages outside stream blocks. */
PyObject *spd_bind_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *spd_decode_begin(PyObject *module, PyObject *data);
PyObject *spd_decode_commit(PyObject *module, PyObject *data);
PyObject *spd_decode_insert(PyObject *module, PyObject *data);
PyObject *spd_decode_update(PyObject *module, PyObject *data);
PyObject *spd_decode_delete(PyObject *module, PyObject *data);

#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#endif
