/*
 * The read-ahead's fill for applier.speedups._speedups (see module.c):
 * fill_copy, the C twin of readahead.py's (used by applier/stream/readahead.py).
 */
#include "speedups.h"

/* Append `n` bytes at `p` to the bytearray `ba` (which grows as list does). */
static int
bytearray_append(PyObject *ba, const void *p, Py_ssize_t n)
{
    Py_ssize_t size = PyByteArray_GET_SIZE(ba);
    if (PyByteArray_Resize(ba, size + n) < 0)
        return -1;
    memcpy(PyByteArray_AS_STRING(ba) + size, p, (size_t)n);
    return 0;
}

/* get()'s next message into data and lens: 1 taken, 0 none buffered, 2 the COPY
 * ended, -1 with an exception. */
static int
fill_one(PyObject *get, PyObject *data, PyObject *lens)
{
    PyObject *r = PyObject_CallNoArgs(get);
    if (r == NULL)
        return -1;
    if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) != 2) {
        Py_DECREF(r);
        PyErr_SetString(PyExc_TypeError, "fill_copy: get() must return (n, data)");
        return -1;
    }
    long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
    int status = n > 0 ? 1 : n == 0 ? 0 : 2;
    if (n == -1 && PyErr_Occurred())
        status = -1;
    else if (status == 1) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(r, 1), &b, PyBUF_SIMPLE) < 0)
            status = -1;
        else {
            long long len = (long long)b.len;
            if (bytearray_append(data, b.buf, b.len) < 0 ||
                bytearray_append(lens, &len, (Py_ssize_t)sizeof len) < 0)
                status = -1;
            PyBuffer_Release(&b);
        }
    }
    Py_DECREF(r);
    return status;
}

/* fill_copy(consume, get, data, lens, room) -> status
 *
 * The read-ahead's fill (applier.stream.readahead): calls consume()
 * (PGconn.consume_input), then get() (get_copy_data with async=1 bound) while
 * it gives a message, each message's bytes appended to the bytearray `data`
 * and its length (8 bytes, native order: an array('q') once read back) to the
 * bytearray `lens`; consume() again once get() has nothing (one consume_input
 * reads what fits libpq's buffer, not what the socket holds), until a
 * consume() brings no message or `data` holds `room` bytes. Status 0: that;
 * 1: get() returned -1 (the COPY ended). An exception of consume() or get()
 * propagates, with what was taken before it left in `data` and `lens`.
 */
PyObject *
spd_fill_copy(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyByteArray_Check(args[2]) || !PyByteArray_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "fill_copy(consume, get, data: bytearray, lens: bytearray, room)");
        return NULL;
    }
    PyObject *consume = args[0], *get = args[1], *data = args[2], *lens = args[3];
    Py_ssize_t room = PyLong_AsSsize_t(args[4]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    while (PyByteArray_GET_SIZE(data) < room) {
        PyObject *r = PyObject_CallNoArgs(consume);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        int took = 0, status = 1;
        while (status == 1 && PyByteArray_GET_SIZE(data) < room) {
            status = fill_one(get, data, lens);
            took |= status == 1;
        }
        if (status < 0)
            return NULL;
        if (status == 2)
            return PyLong_FromLong(1);
        if (!took)
            break;
    }
    return PyLong_FromLong(0);
}
