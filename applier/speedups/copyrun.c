/*
 * COPY framing for applier.speedups._speedups (see module.c): rows of
 * values to COPY text and binary (copy_text_row, copy_binary_row), and an
 * INSERT's TupleData straight to its COPY text line, alone or for a run of
 * messages (tuple_text_line, tuple_text_lines).
 */
#include "speedups.h"

/* ------------------------------------------------------------------ COPY rows */

/* struct.error, what the Python twins raise for a row COPY binary cannot count. */
static PyObject *struct_error;

/* struct.error, looked up once when the module is imported: 0, or -1 with an
 * exception set. */
int
spd_copyframe_init(void)
{
    if (struct_error != NULL)
        return 0;
    PyObject *mod = PyImport_ImportModule("struct");
    if (mod == NULL)
        return -1;
    struct_error = PyObject_GetAttrString(mod, "error");
    Py_DECREF(mod);
    return struct_error == NULL ? -1 : 0;
}

/* A value of a row: its bytes, borrowed from a bytes object or held through a
 * buffer view for other bytes-like objects (bytearray, memoryview). */
typedef struct {
    const unsigned char *buf;
    Py_ssize_t len;
    int is_null;
    int has_view;
    Py_buffer view;
} Value;

#define SMALL_ROW 64

typedef struct {
    PyObject *seq; /* the values: a tuple, or a list of bytes and None */
    Py_ssize_t n;
    Value *vals;
    Value small[SMALL_ROW];
} Row;

static void
row_release(Row *row)
{
    if (row->vals != NULL) {
        for (Py_ssize_t i = 0; i < row->n; i++)
            if (row->vals[i].has_view)
                PyBuffer_Release(&row->vals[i].view);
        if (row->vals != row->small)
            PyMem_Free(row->vals);
    }
    Py_XDECREF(row->seq);
}

/* Whether the list holds only bytes and None (what a row of the stream holds). */
static int
bytes_or_none(PyObject *list)
{
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *o = PyList_GET_ITEM(list, i);
        if (o != Py_None && !PyBytes_Check(o))
            return 0;
    }
    return 1;
}

static int
row_open(Row *row, PyObject *values)
{
    row->vals = NULL;
    row->n = 0;
    row->seq = PySequence_Fast(values, "a COPY row must be a sequence");
    if (row->seq == NULL)
        return -1;
    /* The bytes of each value are borrowed until the row is written. Of bytes
     * and None nothing runs; but a buffer view of another type (another
     * library's) may run code that changes the caller's list and drops values
     * read before: then the values are read from a tuple copy, ours. */
    if (row->seq == values && PyList_Check(values) && !bytes_or_none(values)) {
        Py_SETREF(row->seq, PyList_AsTuple(values));
        if (row->seq == NULL)
            return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(row->seq);
    if (n <= SMALL_ROW) {
        row->vals = row->small;
    }
    else {
        row->vals = PyMem_Calloc((size_t)n, sizeof(Value));
        if (row->vals == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    PyObject **items = PySequence_Fast_ITEMS(row->seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row->vals[i];
        PyObject *o = items[i];
        v->has_view = 0;
        v->is_null = 0;
        row->n = i + 1;
        if (o == Py_None) {
            v->is_null = 1;
            v->buf = NULL;
            v->len = 0;
        }
        else if (PyBytes_Check(o)) {
            v->buf = (const unsigned char *)PyBytes_AS_STRING(o);
            v->len = PyBytes_GET_SIZE(o);
        }
        else {
            if (PyObject_GetBuffer(o, &v->view, PyBUF_SIMPLE) < 0)
                return -1;
            v->has_view = 1;
            v->buf = v->view.buf;
            v->len = v->view.len;
        }
    }
    return 0;
}

/* Bytes COPY text format escapes: backslash, tab, newline, carriage return. */
static inline int
escaped(unsigned char c)
{
    return c == '\\' || c == '\t' || c == '\n' || c == '\r';
}

PyObject *
spd_copy_text_row(PyObject *module, PyObject *values)
{
    Row row;
    if (row_open(&row, values) < 0) {
        row_release(&row);
        return NULL;
    }
    Py_ssize_t n = row.n;
    /* Separators and the final newline: n - 1 tabs + 1 newline (a line of
     * zero columns is just "\n", as b"\t".join([]) + b"\n" is). */
    Py_ssize_t total = n > 0 ? n : 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row.vals[i];
        if (v->is_null) {
            total += 2;
            continue;
        }
        total += v->len;
        for (Py_ssize_t j = 0; j < v->len; j++)
            total += escaped(v->buf[j]);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        row_release(&row);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row.vals[i];
        if (i > 0)
            *o++ = '\t';
        if (v->is_null) {
            *o++ = '\\';
            *o++ = 'N';
            continue;
        }
        for (Py_ssize_t j = 0; j < v->len; j++) {
            unsigned char c = v->buf[j];
            if (escaped(c)) {
                *o++ = '\\';
                *o++ = c == '\\' ? '\\' : c == '\t' ? 't' : c == '\n' ? 'n' : 'r';
            }
            else {
                *o++ = c;
            }
        }
    }
    *o++ = '\n';
    row_release(&row);
    return out;
}

static inline unsigned char *
put_i32(unsigned char *o, int32_t x)
{
    uint32_t u = (uint32_t)x;
    o[0] = (unsigned char)(u >> 24);
    o[1] = (unsigned char)(u >> 16);
    o[2] = (unsigned char)(u >> 8);
    o[3] = (unsigned char)u;
    return o + 4;
}

PyObject *
spd_copy_binary_row(PyObject *module, PyObject *values)
{
    Row row;
    if (row_open(&row, values) < 0) {
        row_release(&row);
        return NULL;
    }
    Py_ssize_t n = row.n;
    /* The same limits as struct.pack(">h") and (">i") in the Python twin, and
     * its error: struct.error. */
    if (n > INT16_MAX) {
        row_release(&row);
        PyErr_SetString(struct_error, "a COPY binary row holds at most 32767 values");
        return NULL;
    }
    Py_ssize_t total = 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row.vals[i];
        if (!v->is_null && v->len > INT32_MAX) {
            row_release(&row);
            PyErr_SetString(struct_error, "a COPY binary value is at most 2**31-1 bytes");
            return NULL;
        }
        total += 4 + (v->is_null ? 0 : v->len);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        row_release(&row);
        return NULL;
    }
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    o[0] = (unsigned char)((uint16_t)n >> 8);
    o[1] = (unsigned char)n;
    o += 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row.vals[i];
        if (v->is_null) {
            o = put_i32(o, -1);
            continue;
        }
        o = put_i32(o, (int32_t)v->len);
        if (v->len > 0)
            memcpy(o, v->buf, (size_t)v->len);
        o += v->len;
    }
    row_release(&row);
    return out;
}

/* The size of the COPY text line of the TupleData at buf[pos:size] (which must end
 * there), its width in *width; -1 when it makes no line (a binary or
 * unchanged-TOAST value, or malformed bytes). */
static Py_ssize_t
text_line_size(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, Py_ssize_t *width)
{
    if (pos < 0 || size - pos < 2)
        return -1;
    Py_ssize_t n = (Py_ssize_t)buf[pos] << 8 | buf[pos + 1];
    Py_ssize_t p = pos + 2;
    Py_ssize_t total = n > 0 ? n : 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p >= size)
            return -1;
        unsigned char k = buf[p];
        if (k == 'n') {
            total += 2;
            p += 1;
            continue;
        }
        if (k != 't' || size - p < 5)
            return -1;
        uint32_t len = read_u32(buf + p + 1);
        if ((uint64_t)len > (uint64_t)(size - p - 5))
            return -1;
        const unsigned char *v = buf + p + 5;
        total += (Py_ssize_t)len;
        for (uint32_t j = 0; j < len; j++)
            total += escaped(v[j]);
        p += 5 + (Py_ssize_t)len;
    }
    if (p != size)
        return -1;
    *width = n;
    return total;
}

/* Write the line text_line_size sized (n values) at o; return the end. */
static unsigned char *
text_line_write(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t n, unsigned char *o)
{
    Py_ssize_t p = pos + 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i > 0)
            *o++ = '\t';
        if (buf[p] == 'n') {
            *o++ = '\\';
            *o++ = 'N';
            p += 1;
            continue;
        }
        Py_ssize_t len = (Py_ssize_t)read_u32(buf + p + 1);
        const unsigned char *v = buf + p + 5;
        for (Py_ssize_t j = 0; j < len; j++) {
            unsigned char c = v[j];
            if (escaped(c)) {
                *o++ = '\\';
                *o++ = c == '\\' ? '\\' : c == '\t' ? 't' : c == '\n' ? 'n' : 'r';
            }
            else {
                *o++ = c;
            }
        }
        p += 5 + len;
    }
    *o++ = '\n';
    return o;
}

/* tuple_text_line(data, pos) -> (line, width) | (None, -1): the COPY text line of
 * the TupleData at pos, which must end data (copyrun.tuple_text_line's twin). Only
 * text values and NULLs make a line; a binary or unchanged-TOAST value, or
 * malformed bytes, give (None, -1) and the caller decodes the message the
 * ordinary way. No Python object per value: one pass checks and sizes, one
 * pass writes. */
PyObject *
spd_tuple_text_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    SpdBytes data;
    Py_ssize_t pos, n;
    if (spd_data_pos_args(args, nargs, "tuple_text_line", &data, &pos) < 0)
        return NULL;
    Py_ssize_t total = text_line_size(data.buf, data.len, pos, &n);
    PyObject *out = total < 0 ? NULL : PyBytes_FromStringAndSize(NULL, total);
    if (out != NULL)
        text_line_write(data.buf, pos, n, (unsigned char *)PyBytes_AS_STRING(out));
    spd_bytes_close(&data);
    if (total < 0)
        return Py_BuildValue("(On)", Py_None, (Py_ssize_t)-1);
    return out == NULL ? NULL : Py_BuildValue("(Nn)", out, n);
}

/* tuple_text_lines(datas, start, pos, width, limit) -> (lines, count): the COPY
 * text lines of datas[start], datas[start + 1], ... (each a message whose
 * TupleData is at pos) joined, up to the first that makes no line or whose width
 * is not `width`, and no further once `limit` bytes are reached
 * (copyrun.py's tuple_text_lines's twin: the copy lane's run of rows). */
PyObject *
spd_tuple_text_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError,
                        "tuple_text_lines(datas: list, start, pos, width, limit) takes 5 arguments");
        return NULL;
    }
    PyObject *datas = args[0];
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t pos = PyLong_AsSsize_t(args[2]);
    Py_ssize_t want = PyLong_AsSsize_t(args[3]);
    Py_ssize_t limit = PyLong_AsSsize_t(args[4]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(datas);
    if (start < 0 || start > count) {
        PyErr_SetString(PyExc_IndexError, "tuple_text_lines: start out of range");
        return NULL;
    }
    Py_ssize_t end = start, total = 0;
    /* First pass: which rows make lines, and the bytes they take. */
    while (end < count && total < limit) {
        SpdBytes d;
        Py_ssize_t width;
        if (spd_bytes_open(&d, PyList_GET_ITEM(datas, end), "tuple_text_lines") < 0)
            return NULL; /* not bytes-like: its twin's TypeError */
        Py_ssize_t size = text_line_size(d.buf, d.len, pos, &width);
        spd_bytes_close(&d);
        if (size < 0 || width != want)
            break;
        total += size;
        end++;
    }
    if (end == start)
        return Py_BuildValue("(yn)", "", (Py_ssize_t)0);
    /* No Python code runs from the first pass to the end of the second (a bytes
     * object is not tracked by the garbage collector: allocating one collects
     * nothing), so datas holds the same rows, unchanged. */
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = start; i < end; i++) {
        SpdBytes d;
        if (spd_bytes_open(&d, PyList_GET_ITEM(datas, i), "tuple_text_lines") < 0) {
            Py_DECREF(out);
            return NULL;
        }
        o = text_line_write(d.buf, pos, want, o);
        spd_bytes_close(&d);
    }
    return Py_BuildValue("(Nn)", out, end - start);
}
