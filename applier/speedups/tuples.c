/*
 * TupleData reading for applier.speedups._speedups (see module.c):
 * tuple_data, the C twin of tuples.py's tuple_data, its reader spd_read_tuple (which
 * mergelane.c shares), and the (data, pos) argument parsing it shares with
 * copyrun.c's tuple_text_line.
 */
#include "speedups.h"

/* b"t" * n for n < ALL_TEXT_MAX: rows that are all text share one kinds object,
 * as the Python reader's tuples._ALL_TEXT does (millions of rows, one object). */
#define ALL_TEXT_MAX 128
static PyObject *all_text_kinds[ALL_TEXT_MAX];

/* The (data, pos) arguments of tuple_data and tuple_text_line: 0 with `data`
 * open (spd_bytes_close it), or -1 with an exception set. */
int
spd_data_pos_args(PyObject *const *args, Py_ssize_t nargs, const char *name, SpdBytes *data,
                  Py_ssize_t *pos)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(data, pos) takes 2 arguments", name);
        return -1;
    }
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    return spd_bytes_open(data, args[0], name);
}

/* Read the TupleData at buf[pos:size]: 1 with new references in *kinds and
 * *values and its end in *end; 0 when it is malformed (nothing allocated); -1
 * with an exception set. */
int
spd_read_tuple(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, PyObject **kinds_out,
               PyObject **values_out, Py_ssize_t *end_out)
{
    if (pos < 0 || size - pos < 2)
        return 0;

    Py_ssize_t n = (Py_ssize_t)buf[pos] << 8 | buf[pos + 1];
    Py_ssize_t p = pos + 2;
    /* Validate the whole tuple before allocating anything: a malformed one
     * costs no objects, and the build loop below needs no checks. */
    int all_text = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p >= size)
            return 0;
        unsigned char k = buf[p];
        if (k == 't' || k == 'b') {
            if (size - p < 5)
                return 0;
            uint32_t len = read_u32(buf + p + 1);
            if ((uint64_t)len > (uint64_t)(size - p - 5))
                return 0;
            p += 5 + (Py_ssize_t)len;
            if (k == 'b')
                all_text = 0;
        }
        else if (k == 'n' || k == 'u') {
            p += 1;
            all_text = 0;
        }
        else {
            return 0;
        }
    }
    Py_ssize_t end = p;

    PyObject *kinds;
    if (all_text && n < ALL_TEXT_MAX) {
        kinds = Py_NewRef(all_text_kinds[n]);
    }
    else {
        kinds = PyBytes_FromStringAndSize(NULL, n);
        if (kinds == NULL)
            return -1;
    }
    PyObject *values = PyTuple_New(n);
    if (values == NULL) {
        Py_DECREF(kinds);
        return -1;
    }
    char *kbuf = all_text && n < ALL_TEXT_MAX ? NULL : PyBytes_AS_STRING(kinds);
    p = pos + 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char k = buf[p];
        PyObject *v;
        if (k == 't' || k == 'b') {
            Py_ssize_t len = (Py_ssize_t)read_u32(buf + p + 1);
            v = PyBytes_FromStringAndSize((const char *)buf + p + 5, len);
            if (v == NULL) {
                Py_DECREF(kinds);
                Py_DECREF(values);
                return -1;
            }
            p += 5 + len;
        }
        else {
            v = Py_NewRef(Py_None);
            p += 1;
        }
        if (kbuf != NULL)
            kbuf[i] = (char)k;
        PyTuple_SET_ITEM(values, i, v);
    }
    *kinds_out = kinds;
    *values_out = values;
    *end_out = end;
    return 1;
}

PyObject *
spd_tuple_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    SpdBytes data;
    Py_ssize_t pos, end;
    PyObject *kinds, *values;
    if (spd_data_pos_args(args, nargs, "tuple_data", &data, &pos) < 0)
        return NULL;
    int got = spd_read_tuple(data.buf, data.len, pos, &kinds, &values, &end);
    spd_bytes_close(&data);
    if (got < 0)
        return NULL;
    if (got == 0)
        Py_RETURN_NONE;
    PyObject *endobj = PyLong_FromSsize_t(end);
    if (endobj == NULL) {
        Py_DECREF(kinds);
        Py_DECREF(values);
        return NULL;
    }
    PyObject *result = PyTuple_New(3);
    if (result == NULL) {
        Py_DECREF(kinds);
        Py_DECREF(values);
        Py_DECREF(endobj);
        return NULL;
    }
    PyTuple_SET_ITEM(result, 0, kinds);
    PyTuple_SET_ITEM(result, 1, values);
    PyTuple_SET_ITEM(result, 2, endobj);
    return result;
}

/* The shared all-text kinds objects, made once when the module is imported:
 * 0, or -1 with an exception set. */
int
spd_tuples_init(void)
{
    for (Py_ssize_t n = 0; n < ALL_TEXT_MAX; n++) {
        if (all_text_kinds[n] != NULL)
            continue;
        all_text_kinds[n] = PyBytes_FromStringAndSize(NULL, n);
        if (all_text_kinds[n] == NULL)
            return -1;
        memset(PyBytes_AS_STRING(all_text_kinds[n]), 't', (size_t)n);
    }
    return 0;
}
