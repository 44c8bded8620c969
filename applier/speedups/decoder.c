/*
 * The decoder's transaction and row messages outside stream blocks, in C for
 * applier.speedups._speedups (see module.c): decode_begin, decode_commit,
 * decode_insert, decode_update, decode_delete, the twins of decoder._begin,
 * _commit, _insert, _update and _delete.
 *
 * A pgbench transaction is six messages (Begin, three Updates, an Insert,
 * Commit); decoding them in Python cost ~4.4 us, a seventh of what the worker
 * spends on the transaction. Here each builds its message the way
 * messages.fast_constructor does: the type's tp_alloc, then every field
 * through its slot descriptor (frozen dataclasses refuse setattr).
 *
 * Only valid, ordinary input is decoded here. Anything else (a length, flag,
 * marker or TupleData that is off) goes to the Python twin, which decodes what
 * is valid and raises the precise DecodeError for the rest: the errors are
 * worded in one place. bind_rows() gives the message classes, Lsn and the
 * twins once, at the decoder's import.
 */
#include "speedups.h"

enum { K_BEGIN, K_COMMIT, K_INSERT, K_UPDATE, K_DELETE, K_TUPLE, K_COUNT };
#define MAX_FIELDS 5

static const char *const field_names[K_COUNT][MAX_FIELDS + 1] = {
    {"final_lsn", "commit_ts", "xid", NULL},
    {"flags", "commit_lsn", "end_lsn", "commit_ts", NULL},
    {"xid", "relation_oid", "new", NULL},
    {"xid", "relation_oid", "old", "old_kind", "new", NULL},
    {"xid", "relation_oid", "old", "old_kind", NULL},
    {"kinds", "values", NULL},
};

typedef struct {
    PyObject *cls;
    allocfunc alloc;
    int nfields;
    PyObject *descr[MAX_FIELDS];
    descrsetfunc set[MAX_FIELDS];
} MessageClass;

static MessageClass classes[K_COUNT];
static PyObject *twins[K_TUPLE];
static PyObject *lsn_type;
static PyObject *old_kind_k, *old_kind_o;
static int bound;

/* A big-endian uint64 at p. */
static inline uint64_t
read_u64(const unsigned char *p)
{
    return (uint64_t)read_u32(p) << 32 | read_u32(p + 4);
}

static int
bind_class(MessageClass *mc, PyObject *cls, const char *const *names)
{
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_TypeError, "bind_rows: expected the message classes");
        return -1;
    }
    mc->cls = Py_NewRef(cls);
    mc->alloc = (allocfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_alloc);
    if (mc->alloc == NULL) {
        PyErr_SetString(PyExc_TypeError, "bind_rows: a class without tp_alloc");
        return -1;
    }
    mc->nfields = 0;
    for (int i = 0; names[i] != NULL; i++) {
        PyObject *d = PyObject_GetAttrString(cls, names[i]);
        if (d == NULL)
            return -1;
        descrsetfunc set = (descrsetfunc)PyType_GetSlot(Py_TYPE(d), Py_tp_descr_set);
        if (set == NULL) {
            Py_DECREF(d);
            PyErr_Format(PyExc_TypeError, "bind_rows: %s is not a slot", names[i]);
            return -1;
        }
        mc->descr[i] = d;
        mc->set[i] = set;
        mc->nfields++;
    }
    return 0;
}

/* bind_rows(Begin, Commit, Insert, Update, Delete, TupleData, Lsn, twins) */
PyObject *
spd_bind_rows(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 8 || !PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != K_TUPLE) {
        PyErr_SetString(PyExc_TypeError,
                        "bind_rows(Begin, Commit, Insert, Update, Delete, TupleData, Lsn, twins)");
        return NULL;
    }
    if (bound) /* once per process: the decoder's import */
        Py_RETURN_NONE;
    for (int k = 0; k < K_COUNT; k++)
        if (bind_class(&classes[k], args[k], field_names[k]) < 0)
            return NULL;
    lsn_type = Py_NewRef(args[6]);
    for (int k = 0; k < K_TUPLE; k++)
        twins[k] = Py_NewRef(PyTuple_GET_ITEM(args[7], k));
    old_kind_k = PyUnicode_InternFromString("K");
    old_kind_o = PyUnicode_InternFromString("O");
    if (old_kind_k == NULL || old_kind_o == NULL)
        return NULL;
    bound = 1;
    Py_RETURN_NONE;
}

/* A new instance of class k with the given field values; steals the
 * references in vals (NULL in vals: an allocation failed, so does this). */
static PyObject *
build(int k, PyObject **vals)
{
    MessageClass *mc = &classes[k];
    PyObject *obj = NULL;
    int i;
    for (i = 0; i < mc->nfields; i++)
        if (vals[i] == NULL)
            goto done;
    obj = mc->alloc((PyTypeObject *)mc->cls, 0);
    if (obj == NULL)
        goto done;
    for (i = 0; i < mc->nfields; i++) {
        if (mc->set[i](mc->descr[i], obj, vals[i]) < 0) {
            Py_CLEAR(obj);
            goto done;
        }
    }
done:
    for (i = 0; i < mc->nfields; i++)
        Py_XDECREF(vals[i]);
    return obj;
}

static PyObject *
new_lsn(uint64_t v)
{
    PyObject *n = PyLong_FromUnsignedLongLong(v);
    if (n == NULL)
        return NULL;
    PyObject *lsn = PyObject_CallOneArg(lsn_type, n);
    Py_DECREF(n);
    return lsn;
}

static PyObject *
twin(int k, PyObject *data)
{
    return PyObject_CallOneArg(twins[k], data);
}

static int
unbound(void)
{
    if (!bound)
        PyErr_SetString(PyExc_RuntimeError, "applier.speedups._speedups: bind_rows() first");
    return !bound;
}

/* The TupleData at buf[pos:size] as a TupleData: 1 with *out and *end, 0 when
 * it is malformed, -1 with an exception set. */
static int
read_tupledata(const unsigned char *buf, Py_ssize_t size, Py_ssize_t pos, PyObject **out,
               Py_ssize_t *end)
{
    PyObject *vals[2];
    int got = spd_read_tuple(buf, size, pos, &vals[0], &vals[1], end);
    if (got <= 0)
        return got;
    *out = build(K_TUPLE, vals);
    return *out == NULL ? -1 : 1;
}

PyObject *
spd_decode_begin(PyObject *module, PyObject *data)
{
    if (unbound())
        return NULL;
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) != 21)
        return twin(K_BEGIN, data);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    PyObject *vals[3] = {
        new_lsn(read_u64(b + 1)),
        PyLong_FromLongLong((long long)read_u64(b + 9)),
        PyLong_FromUnsignedLong(read_u32(b + 17)),
    };
    return build(K_BEGIN, vals);
}

PyObject *
spd_decode_commit(PyObject *module, PyObject *data)
{
    if (unbound())
        return NULL;
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) != 26)
        return twin(K_COMMIT, data);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    if (b[1] != 0)
        return twin(K_COMMIT, data); /* unknown flags: its error */
    PyObject *vals[4] = {
        PyLong_FromLong(0),
        new_lsn(read_u64(b + 2)),
        new_lsn(read_u64(b + 10)),
        PyLong_FromLongLong((long long)read_u64(b + 18)),
    };
    return build(K_COMMIT, vals);
}

/* Insert, Update, Delete: relation_oid, then tuples from offset 5. */
static PyObject *
decode_row(int k, PyObject *data)
{
    if (unbound())
        return NULL;
    if (!PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) < 6)
        return twin(k, data);
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), pos = 5, end;
    PyObject *old = NULL, *old_kind = NULL, *new = NULL;
    unsigned char marker = b[pos];
    int got;
    if (k != K_INSERT && (marker == 'K' || marker == 'O')) {
        got = read_tupledata(b, size, pos + 1, &old, &end);
        if (got <= 0)
            goto fail;
        old_kind = Py_NewRef(marker == 'K' ? old_kind_k : old_kind_o);
        pos = end;
        if (k == K_UPDATE)
            marker = pos < size ? b[pos] : 0;
    }
    else if (k == K_DELETE) {
        got = 0; /* a Delete needs its old tuple */
        goto fail;
    }
    if (k != K_DELETE) {
        if (marker != 'N') {
            got = 0;
            goto fail;
        }
        got = read_tupledata(b, size, pos + 1, &new, &end);
        if (got <= 0)
            goto fail;
    }
    if (end != size) {
        got = 0;
        goto fail;
    }
    PyObject *relid = PyLong_FromUnsignedLong(read_u32(b + 1));
    if (k == K_INSERT) {
        PyObject *vals[3] = {Py_NewRef(Py_None), relid, new};
        return build(K_INSERT, vals);
    }
    if (old == NULL) {
        old = Py_NewRef(Py_None);
        old_kind = Py_NewRef(Py_None);
    }
    if (k == K_UPDATE) {
        PyObject *vals[5] = {Py_NewRef(Py_None), relid, old, old_kind, new};
        return build(K_UPDATE, vals);
    }
    PyObject *vals[4] = {Py_NewRef(Py_None), relid, old, old_kind};
    return build(K_DELETE, vals);

fail:
    Py_XDECREF(old);
    Py_XDECREF(old_kind);
    Py_XDECREF(new);
    return got < 0 ? NULL : twin(k, data);
}

PyObject *
spd_decode_insert(PyObject *module, PyObject *data)
{
    return decode_row(K_INSERT, data);
}

PyObject *
spd_decode_update(PyObject *module, PyObject *data)
{
    return decode_row(K_UPDATE, data);
}

PyObject *
spd_decode_delete(PyObject *module, PyObject *data)
{
    return decode_row(K_DELETE, data);
}
