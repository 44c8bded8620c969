/*
 * The merge lane's loop for applier.speedups._speedups (see module.c):
 * hold_rows, the C twin of mergelane.py's (used by applier/apply/batching/mergelane.py).
 */
#include "speedups.h"

/* What a streamed UPDATE's or DELETE's TupleData follows: 'U'|'D', the xid,
 * the relation and the tuple's kind. */
#define ROW_AT 10
/* Key columns held here at most: PostgreSQL's INDEX_MAX_KEYS as built by default. */
#define MAX_KEY 32

/* The key of a row: values[key[0]] for a one-column key, else the tuple of
 * the key's values; a new reference, or NULL with an exception set. */
static PyObject *
row_key(PyObject *values, const Py_ssize_t *cols, Py_ssize_t ncols)
{
    if (ncols == 1)
        return Py_NewRef(PyTuple_GET_ITEM(values, cols[0]));
    PyObject *key = PyTuple_New(ncols);
    if (key == NULL)
        return NULL;
    for (Py_ssize_t c = 0; c < ncols; c++)
        PyTuple_SET_ITEM(key, c, Py_NewRef(PyTuple_GET_ITEM(values, cols[c])));
    return key;
}

/* (values, kinds, (lsn, data, no, txn)), stealing values and kinds (also on
 * failure); NULL with an exception set. */
static PyObject *
held_row(PyObject *values, PyObject *kinds, PyObject *lsn, PyObject *data, long long no,
         PyObject *txn)
{
    PyObject *ref = NULL, *nobj = PyLong_FromLongLong(no);
    if (nobj != NULL) {
        ref = PyTuple_Pack(4, lsn, data, nobj, txn);
        Py_DECREF(nobj);
    }
    PyObject *row = ref == NULL ? NULL : PyTuple_Pack(3, values, kinds, ref);
    Py_XDECREF(ref);
    Py_DECREF(values);
    Py_DECREF(kinds);
    return row;
}

/* Hold one row, `data` (the message's bytes, which the caller holds a reference
 * to), its LSN lsns[j]: 0 held, 1 not held (the loop stops there), -1 with an
 * exception set. */
static int
hold_one(PyObject *data, PyObject *lsns, Py_ssize_t j, Py_ssize_t width, const Py_ssize_t *cols,
         Py_ssize_t ncols, PyObject *rows, PyObject *keys, PyObject *txn, long long no)
{
    int updates = keys == Py_None;
    if (!PyBytes_CheckExact(data)) { /* as its twin: type(data) is bytes */
        PyErr_SetString(PyExc_TypeError, "hold_rows: datas must hold bytes");
        return -1;
    }
    const unsigned char *buf = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t len = PyBytes_GET_SIZE(data), end;
    PyObject *kinds, *values;
    int got = spd_read_tuple(buf, len, ROW_AT, &kinds, &values, &end);
    if (got <= 0)
        return got < 0 ? -1 : 1;
    if (end != len || PyBytes_GET_SIZE(kinds) != width ||
        memchr(PyBytes_AS_STRING(kinds), 'u', (size_t)width) != NULL) {
        Py_DECREF(kinds);
        Py_DECREF(values);
        return 1;
    }
    PyObject *k = row_key(values, cols, ncols);
    if (k == NULL) {
        Py_DECREF(kinds);
        Py_DECREF(values);
        return -1;
    }
    /* Read after the checks, as its twin reads lsns[j]; held, as data is. */
    PyObject *lsn = j < PyList_GET_SIZE(lsns) ? Py_NewRef(PyList_GET_ITEM(lsns, j)) : NULL;
    if (lsn == NULL) {
        PyErr_SetString(PyExc_IndexError, "hold_rows: fewer lsns than datas");
        Py_DECREF(k);
        Py_DECREF(kinds);
        Py_DECREF(values);
        return -1;
    }
    if (!updates) {
        int held = PySet_Contains(keys, k);
        if (held == 0)
            held = PySet_Add(keys, k) < 0 ? -1 : 0;
        if (held != 0) {
            Py_DECREF(lsn);
            Py_DECREF(k);
            Py_DECREF(kinds);
            Py_DECREF(values);
            return held < 0 ? -1 : 1;
        }
    }
    PyObject *row = held_row(values, kinds, lsn, data, no, txn);
    int failed = row == NULL ||
                 (updates ? PyDict_SetItem(rows, k, row) : PyList_Append(rows, row)) < 0;
    Py_XDECREF(row);
    Py_DECREF(lsn);
    Py_DECREF(k);
    return failed ? -1 : 0;
}

/* hold_rows(datas, lsns, start, width, key, rows, keys, txn, no, size, max_rows,
 * max_bytes) -> (count, size): see mergelane.py's hold_rows, whose every check this makes
 * in the same order. */
PyObject *
spd_hold_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 12) {
        PyErr_SetString(PyExc_TypeError,
                        "hold_rows(datas, lsns, start, width, key, rows, keys, txn, no, size, "
                        "max_rows, max_bytes) takes 12 arguments");
        return NULL;
    }
    PyObject *datas = args[0], *lsns = args[1], *key = args[4], *rows = args[5];
    PyObject *keys = args[6], *txn = args[7];
    int updates = keys == Py_None;
    if (!PyList_Check(datas) || !PyList_Check(lsns) || !PyTuple_Check(key) ||
        PyTuple_GET_SIZE(key) < 1 || (updates ? !PyDict_Check(rows) : !PyList_Check(rows)) ||
        (!updates && !PySet_Check(keys))) {
        PyErr_SetString(PyExc_TypeError,
                        "hold_rows: datas and lsns must be lists, key a non-empty tuple, and "
                        "rows a dict (keys None) or a list (keys a set)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[2]);
    Py_ssize_t width = PyLong_AsSsize_t(args[3]);
    long long no = PyLong_AsLongLong(args[8]);
    Py_ssize_t size = PyLong_AsSsize_t(args[9]);
    Py_ssize_t max_rows = PyLong_AsSsize_t(args[10]);
    Py_ssize_t max_bytes = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred())
        return NULL;
    Py_ssize_t ncols = PyTuple_GET_SIZE(key);
    Py_ssize_t cols[MAX_KEY];
    if (ncols > MAX_KEY) /* left to the caller, as its twin leaves it */
        return Py_BuildValue("(nn)", (Py_ssize_t)0, size);
    for (Py_ssize_t c = 0; c < ncols; c++) {
        cols[c] = PyLong_AsSsize_t(PyTuple_GET_ITEM(key, c));
        if (cols[c] == -1 && PyErr_Occurred())
            return NULL;
        if (cols[c] < 0 || cols[c] >= width) {
            PyErr_SetString(PyExc_ValueError, "hold_rows: a key column outside the width");
            return NULL;
        }
    }
    if (start < 0) {
        PyErr_SetString(PyExc_ValueError, "hold_rows: start < 0");
        return NULL;
    }
    Py_ssize_t j = start;
    /* The lists' sizes are read on every row, and each row's bytes and LSN held
     * by a reference of ours while it is read and held: the allocations on the
     * way can run a garbage collection, hence Python code (gc.callbacks, a
     * __del__), which may change the lists and drop their items. */
    while (j < PyList_GET_SIZE(datas)) {
        PyObject *data = Py_NewRef(PyList_GET_ITEM(datas, j));
        int stop = hold_one(data, lsns, j, width, cols, ncols, rows, keys, txn, no);
        if (stop < 0) {
            Py_DECREF(data);
            return NULL;
        }
        if (stop) {
            Py_DECREF(data);
            break;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(data);
        Py_DECREF(data);
        if (updates)
            size += len;
        no += 1;
        j += 1;
        Py_ssize_t held = updates ? PyDict_GET_SIZE(rows) : PyList_GET_SIZE(rows);
        if (held >= max_rows || size >= max_bytes)
            break;
    }
    return Py_BuildValue("(nn)", j - start, size);
}
