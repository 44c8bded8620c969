/*
 * What the source files of applier.protocol._speedups share (one extension
 * module built from several files: see _speedups.c for the list of functions
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

/* Hidden from the .so's dynamic symbols: as when the module was one file,
 * PyInit__speedups is all it exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(hidden)
#endif

/* _tuples.c: TupleData reading. */
int spd_data_pos_args(PyObject *const *args, Py_ssize_t nargs, const char *name,
                      const unsigned char **buf, Py_ssize_t *size, Py_ssize_t *pos);
PyObject *spd_tuple_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_read_tuple(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, PyObject **kinds,
                   PyObject **values, Py_ssize_t *end);
int spd_tuples_init(void);

/* _copyframe.c: COPY framing. */
PyObject *spd_copy_text_row(PyObject *module, PyObject *values);
PyObject *spd_copy_binary_row(PyObject *module, PyObject *values);
PyObject *spd_tuple_text_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *spd_tuple_text_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_copyframe_init(void);

/* _readloop.c: the stream client's read loop. */
PyObject *spd_take_xlog(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *spd_fill_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_readloop_init(void);

/* _dispatch.c: the apply worker's loop over a batch. */
PyObject *spd_dispatch_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
int spd_dispatch_init(void);

/* _holdrun.c: the merge lane's loop. */
PyObject *spd_hold_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* _rowmsgs.c: transaction and row messages outside stream blocks. */
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
