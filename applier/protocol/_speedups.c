/*
 * applier.protocol._speedups: the per-row hot functions of the decoder and of
 * COPY framing, in C.
 *
 * Each function computes exactly what its pure-Python twin computes (the
 * twins stay the reference and the fallback; applier/protocol/speedups.py
 * chooses, tests/protocol/test_speedups.py checks them equal):
 *
 *   tuple_data(data, pos)   tuples._tuple_py without the error reporting:
 *                           (kinds, values, end), or None when the TupleData
 *                           is malformed (the caller then walks it again with
 *                           tuples._tuple_error for the precise DecodeError).
 *   copy_text_row(values)   copyrun._text_row_py: one line of COPY text.
 *   copy_binary_row(values) copyrun._binary_row_py: one tuple of COPY binary.
 *   tuple_text_line(data, pos)
 *                           copyrun._tuple_text_line_py: an INSERT's TupleData
 *                           straight to its COPY text line (the copy lane).
 *   tuple_text_lines(datas, start, pos, width, limit)
 *                           copyrun._tuple_text_lines_py: the same for a run
 *                           of such messages, joined.
 *   take_xlog(get, decoder, out, room, lsn_type, state[, group])
 *                           the stream client's loop over the CopyData libpq
 *                           has buffered (LogicalStream._take_buffered_py):
 *                           XLogData decoded into out, anything else handed
 *                           back to the caller; with `group`, runs of streamed
 *                           row changes of one head as one item.
 *
 * Only the stable C API is used and nothing is kept between calls but the
 * shared all-text kinds objects, so there is no state to reason about.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* b"t" * n for n < ALL_TEXT_MAX: rows that are all text share one kinds object,
 * as the Python reader's tuples._ALL_TEXT does (millions of rows, one object). */
#define ALL_TEXT_MAX 128
static PyObject *all_text_kinds[ALL_TEXT_MAX];

static inline uint32_t
read_u32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* The (data, pos) arguments of tuple_data and tuple_text_line: 0, or -1 with an
 * exception set. */
static int
data_pos_args(PyObject *const *args, Py_ssize_t nargs, const char *name,
              const unsigned char **buf, Py_ssize_t *size, Py_ssize_t *pos)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(data, pos) takes 2 arguments", name);
        return -1;
    }
    if (!PyBytes_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "%s: data must be bytes", name);
        return -1;
    }
    *pos = PyLong_AsSsize_t(args[1]);
    if (*pos == -1 && PyErr_Occurred())
        return -1;
    *buf = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    *size = PyBytes_GET_SIZE(args[0]);
    return 0;
}

static PyObject *
tuple_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *buf;
    Py_ssize_t size, pos;
    if (data_pos_args(args, nargs, "tuple_data", &buf, &size, &pos) < 0)
        return NULL;
    if (pos < 0 || size - pos < 2)
        Py_RETURN_NONE;

    Py_ssize_t n = (Py_ssize_t)buf[pos] << 8 | buf[pos + 1];
    Py_ssize_t p = pos + 2;
    /* Validate the whole tuple before allocating anything: a malformed one
     * costs no objects, and the build loop below needs no checks. */
    int all_text = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p >= size)
            Py_RETURN_NONE;
        unsigned char k = buf[p];
        if (k == 't' || k == 'b') {
            if (size - p < 5)
                Py_RETURN_NONE;
            uint32_t len = read_u32(buf + p + 1);
            if ((uint64_t)len > (uint64_t)(size - p - 5))
                Py_RETURN_NONE;
            p += 5 + (Py_ssize_t)len;
            if (k == 'b')
                all_text = 0;
        }
        else if (k == 'n' || k == 'u') {
            p += 1;
            all_text = 0;
        }
        else {
            Py_RETURN_NONE;
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
            return NULL;
    }
    PyObject *values = PyTuple_New(n);
    if (values == NULL) {
        Py_DECREF(kinds);
        return NULL;
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
                return NULL;
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

/* ------------------------------------------------------------------ COPY rows */

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
    PyObject *seq; /* PySequence_Fast result */
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

static int
row_open(Row *row, PyObject *values)
{
    row->vals = NULL;
    row->n = 0;
    row->seq = PySequence_Fast(values, "a COPY row must be a sequence");
    if (row->seq == NULL)
        return -1;
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

static PyObject *
copy_text_row(PyObject *module, PyObject *values)
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

static PyObject *
copy_binary_row(PyObject *module, PyObject *values)
{
    Row row;
    if (row_open(&row, values) < 0) {
        row_release(&row);
        return NULL;
    }
    Py_ssize_t n = row.n;
    /* The same limits as struct.pack(">h") and (">i") in the Python twin. */
    if (n > INT16_MAX) {
        row_release(&row);
        PyErr_SetString(PyExc_OverflowError, "a COPY binary row holds at most 32767 values");
        return NULL;
    }
    Py_ssize_t total = 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        Value *v = &row.vals[i];
        if (!v->is_null && v->len > INT32_MAX) {
            row_release(&row);
            PyErr_SetString(PyExc_OverflowError, "a COPY binary value is at most 2**31-1 bytes");
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

/* tuple_text_line(data, pos) -> (line, width) | (None, -1): the COPY text line of
 * the TupleData at pos, which must end data (copyrun.tuple_text_line's twin). Only
 * text values and NULLs make a line; a binary or unchanged-TOAST value, or
 * malformed bytes, give (None, -1) and the caller decodes the message the
 * ordinary way. No Python object per value: one pass checks and sizes, one
 * pass writes. */
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
static PyObject *
tuple_text_line(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const unsigned char *buf;
    Py_ssize_t size, pos, n;
    if (data_pos_args(args, nargs, "tuple_text_line", &buf, &size, &pos) < 0)
        return NULL;
    Py_ssize_t total = text_line_size(buf, size, pos, &n);
    if (total < 0)
        return Py_BuildValue("(On)", Py_None, (Py_ssize_t)-1);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    text_line_write(buf, pos, n, (unsigned char *)PyBytes_AS_STRING(out));
    return Py_BuildValue("(Nn)", out, n);
}

/* tuple_text_lines(datas, start, pos, width, limit) -> (lines, count): the COPY
 * text lines of datas[start], datas[start + 1], ... (each a message whose
 * TupleData is at pos) joined, up to the first that makes no line or whose width
 * is not `width`, and no further once `limit` bytes are reached
 * (copyrun._tuple_text_lines_py's twin: the copy lane's run of rows). */
static PyObject *
tuple_text_lines(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
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
        PyObject *d = PyList_GET_ITEM(datas, end);
        Py_ssize_t width;
        if (!PyBytes_Check(d))
            break;
        Py_ssize_t size = text_line_size((const unsigned char *)PyBytes_AS_STRING(d),
                                         PyBytes_GET_SIZE(d), pos, &width);
        if (size < 0 || width != want)
            break;
        total += size;
        end++;
    }
    if (end == start)
        return Py_BuildValue("(yn)", "", (Py_ssize_t)0);
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = start; i < end; i++)
        o = text_line_write((const unsigned char *)PyBytes_AS_STRING(PyList_GET_ITEM(datas, i)),
                            pos, want, o);
    return Py_BuildValue("(Nn)", out, end - start);
}

/* take_xlog(get, decoder, out, room, lsn_type, state) -> status
 *
 * Calls get(1) (psycopg's PGconn.get_copy_data) while it returns a message and
 * fewer than `room` XLogData went into `out`; each XLogData goes in as
 * (lsn_type(wal_start), decoder._table[payload[0]](payload)), or through
 * decoder.decode(payload) when the table cannot index it (an empty payload).
 * The table is read per message: the handlers of Stream Start/Stop swap it.
 *
 * `state` is [count, nbytes, last, failed_lsn, other], carried across calls
 * and written back on every return, errors included: messages and bytes
 * taken, the highest wal_end seen, the wal_start of a message whose handler
 * raised, and the message returned for the caller.
 * Status 0: nothing more buffered, or `room` reached; 1: the COPY ended (get
 * returned -1); 2: state[4] is a CopyData that is not an XLogData with a full
 * header (a keepalive, or the error the caller names).
 *
 * With `group` = (StreamedChange, StreamedRun), consecutive streamed row changes
 * of one head (the first GROUP_HEAD bytes: tag, xid, relation, tuple kind) go
 * in as one (lsn, StreamedRun(xid, datas, lsns)): the first is decoded as
 * ever (the handler made it a StreamedChange) and each next one that starts
 * with the same bytes is appended to its datas, its wal_start to its lsns
 * (plain ints), without a handler call or an object of its own. A run never
 * spans two calls. Without `group` (or None), every message is an item.
 */
#define XLOG_HEADER 25
#define GROUP_HEAD 10

static PyObject *table_name;

static int
put_state(PyObject *state, Py_ssize_t count, Py_ssize_t nbytes, unsigned long long last)
{
    PyObject *v;
    if ((v = PyLong_FromSsize_t(count)) == NULL || PyList_SetItem(state, 0, v) < 0)
        return -1;
    if ((v = PyLong_FromSsize_t(nbytes)) == NULL || PyList_SetItem(state, 1, v) < 0)
        return -1;
    if ((v = PyLong_FromUnsignedLongLong(last)) == NULL || PyList_SetItem(state, 2, v) < 0)
        return -1;
    return 0;
}

static inline unsigned long long
read_u64(const unsigned char *p)
{
    return (unsigned long long)read_u32(p) << 32 | read_u32(p + 4);
}

/* decoder's handler for `payload`, a new reference (NULL with an exception). */
static PyObject *
handler_for(PyObject *decoder, PyObject *payload)
{
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    PyObject *table = PyObject_GetAttr(decoder, table_name);
    if (table == NULL)
        return NULL;
    PyObject *handler = NULL;
    if (size > 0 && PyList_Check(table)) {
        unsigned char tag = (unsigned char)PyBytes_AS_STRING(payload)[0];
        if (tag < PyList_GET_SIZE(table)) {
            handler = PyList_GET_ITEM(table, tag);
            Py_INCREF(handler);
        }
    }
    Py_DECREF(table);
    if (handler == NULL)
        handler = PyObject_GetAttrString(decoder, "decode");
    return handler;
}

/* A streamed row change that may start a run: an Insert, Update or Delete with
 * its xid, relation and the kind of its (first) tuple. */
static inline int
groupable(PyObject *payload)
{
    if (PyBytes_GET_SIZE(payload) < GROUP_HEAD)
        return 0;
    const char *p = PyBytes_AS_STRING(payload);
    return (p[0] == 'I' || p[0] == 'U' || p[0] == 'D') &&
           (p[9] == 'N' || p[9] == 'K' || p[9] == 'O');
}

/* run_type(change.xid, [payload], [start]) in place of the StreamedChange
 * `change` (whose reference it takes); the run's lists and head go to the
 * caller's. NULL with an exception. */
static PyObject *
start_run(PyObject *change, PyObject *payload, unsigned long long start, PyObject *run_type,
          PyObject **datas, PyObject **lsns, unsigned char *head)
{
    PyObject *xid = PyObject_GetAttrString(change, "xid");
    Py_DECREF(change);
    if (xid == NULL)
        return NULL;
    PyObject *d = PyList_New(1), *l = PyList_New(1);
    PyObject *at = PyLong_FromUnsignedLongLong(start);
    PyObject *run = NULL;
    if (d != NULL && l != NULL && at != NULL) {
        Py_INCREF(payload);
        PyList_SET_ITEM(d, 0, payload);
        PyList_SET_ITEM(l, 0, at);
        at = NULL;
        run = PyObject_CallFunctionObjArgs(run_type, xid, d, l, NULL);
    }
    Py_XDECREF(at);
    Py_DECREF(xid);
    if (run != NULL) {
        *datas = d; /* borrowed from here on: the run holds them */
        *lsns = l;
        memcpy(head, PyBytes_AS_STRING(payload), GROUP_HEAD);
    }
    Py_XDECREF(d);
    Py_XDECREF(l);
    return run;
}

static PyObject *
take_xlog(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6 && nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "take_xlog(get, decoder, out, room, lsn_type, state[, group]) "
                        "takes 6 or 7 arguments");
        return NULL;
    }
    PyObject *get = args[0], *decoder = args[1], *out = args[2], *lsn_type = args[4];
    PyObject *state = args[5];
    PyObject *change_type = NULL, *run_type = NULL;
    if (nargs == 7 && args[6] != Py_None) {
        if (!PyTuple_Check(args[6]) || PyTuple_GET_SIZE(args[6]) != 2) {
            PyErr_SetString(PyExc_TypeError, "take_xlog: group must be (change type, run type)");
            return NULL;
        }
        change_type = PyTuple_GET_ITEM(args[6], 0);
        run_type = PyTuple_GET_ITEM(args[6], 1);
    }
    /* The run being gathered: borrowed, its item is in `out` for as long. */
    PyObject *run_datas = NULL, *run_lsns = NULL;
    unsigned char run_head[GROUP_HEAD];
    if (!PyList_Check(out) || !PyList_Check(state) || PyList_GET_SIZE(state) != 5) {
        PyErr_SetString(PyExc_TypeError, "take_xlog: out must be a list, state a list of 5");
        return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(args[3]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long last = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(state, 2));
    if (last == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(state, 0));
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyList_GET_ITEM(state, 1));
    if ((count == -1 || nbytes == -1) && PyErr_Occurred())
        return NULL;
    long status = 0;
    PyObject *one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    while (room > 0) {
        PyObject *got = PyObject_CallOneArg(get, one);
        if (got == NULL)
            goto error;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_TypeError, "take_xlog: get(1) must return (n, data)");
            goto error;
        }
        Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 0));
        if (n == -1 && PyErr_Occurred()) {
            Py_DECREF(got);
            goto error;
        }
        if (n <= 0) {
            Py_DECREF(got);
            status = n == -1 ? 1 : 0;
            break;
        }
        PyObject *data = PyTuple_GET_ITEM(got, 1);
        Py_buffer view;
        if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
            Py_DECREF(got);
            goto error;
        }
        count += 1;
        nbytes += n;
        const unsigned char *buf = (const unsigned char *)view.buf;
        if (view.len < XLOG_HEADER || buf[0] != 'w') {
            PyBuffer_Release(&view);
            Py_INCREF(data);
            Py_DECREF(got);
            if (PyList_SetItem(state, 4, data) < 0)
                goto error;
            status = 2;
            break;
        }
        unsigned long long start = read_u64(buf + 1), end = read_u64(buf + 9);
        PyObject *payload = PyBytes_FromStringAndSize((const char *)buf + XLOG_HEADER,
                                                      view.len - XLOG_HEADER);
        PyBuffer_Release(&view);
        Py_DECREF(got);
        if (payload == NULL)
            goto error;
        if (run_datas != NULL && PyBytes_GET_SIZE(payload) >= GROUP_HEAD &&
            memcmp(PyBytes_AS_STRING(payload), run_head, GROUP_HEAD) == 0) {
            PyObject *at = PyLong_FromUnsignedLongLong(start);
            int failed = at == NULL || PyList_Append(run_lsns, at) < 0 ||
                         PyList_Append(run_datas, payload) < 0;
            Py_XDECREF(at);
            Py_DECREF(payload);
            if (failed)
                goto error;
            room -= 1;
            if (end > last)
                last = end;
            continue;
        }
        run_datas = run_lsns = NULL;
        PyObject *handler = handler_for(decoder, payload);
        PyObject *msg = handler == NULL ? NULL : PyObject_CallOneArg(handler, payload);
        Py_XDECREF(handler);
        if (msg != NULL && run_type != NULL && Py_TYPE(msg) == (PyTypeObject *)change_type &&
            groupable(payload))
            msg = start_run(msg, payload, start, run_type, &run_datas, &run_lsns, run_head);
        Py_DECREF(payload);
        if (msg == NULL) {
            PyObject *exc_type, *exc_value, *exc_tb;
            PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
            PyObject *at = PyLong_FromUnsignedLongLong(start);
            if (at != NULL)
                PyList_SetItem(state, 3, at);
            PyErr_Restore(exc_type, exc_value, exc_tb);
            goto error;
        }
        PyObject *at = PyLong_FromUnsignedLongLong(start);
        PyObject *lsn = at == NULL ? NULL : PyObject_CallOneArg(lsn_type, at);
        Py_XDECREF(at);
        PyObject *item = lsn == NULL ? NULL : PyTuple_Pack(2, lsn, msg);
        Py_XDECREF(lsn);
        Py_DECREF(msg);
        if (item == NULL || PyList_Append(out, item) < 0) {
            Py_XDECREF(item);
            goto error;
        }
        Py_DECREF(item);
        room -= 1;
        if (end > last)
            last = end;
    }
    Py_DECREF(one);
    if (put_state(state, count, nbytes, last) < 0)
        return NULL;
    return PyLong_FromLong(status);

error:
    Py_DECREF(one);
    {
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        if (put_state(state, count, nbytes, last) < 0)
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    return NULL;
}

static PyMethodDef methods[] = {
    {"tuple_data", (PyCFunction)(void (*)(void))tuple_data, METH_FASTCALL,
     "tuple_data(data, pos) -> (kinds, values, end) or None if malformed"},
    {"copy_text_row", copy_text_row, METH_O, "copy_text_row(values) -> one COPY text line"},
    {"tuple_text_line", (PyCFunction)(void (*)(void))tuple_text_line, METH_FASTCALL,
     "tuple_text_line(data, pos) -> (COPY text line, width) or (None, -1)"},
    {"copy_binary_row", copy_binary_row, METH_O,
     "copy_binary_row(values) -> one COPY binary tuple"},
    {"take_xlog", (PyCFunction)(void (*)(void))take_xlog, METH_FASTCALL,
     "take_xlog(get, decoder, out, room, lsn_type, state[, group]) -> status (see the source)"},
    {"tuple_text_lines", (PyCFunction)(void (*)(void))tuple_text_lines, METH_FASTCALL,
     "tuple_text_lines(datas, start, pos, width, limit) -> (COPY text lines, count)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "applier.protocol._speedups",
    "C versions of the decoder's and COPY framing's per-row functions.",
    -1,
    methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (table_name == NULL && (table_name = PyUnicode_InternFromString("_table")) == NULL)
        return NULL;
    for (Py_ssize_t n = 0; n < ALL_TEXT_MAX; n++) {
        if (all_text_kinds[n] != NULL)
            continue;
        all_text_kinds[n] = PyBytes_FromStringAndSize(NULL, n);
        if (all_text_kinds[n] == NULL)
            return NULL;
        memset(PyBytes_AS_STRING(all_text_kinds[n]), 't', (size_t)n);
    }
    return PyModule_Create(&module_def);
}
