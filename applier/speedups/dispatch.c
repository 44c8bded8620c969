/*
 * The apply worker's dispatch loop for applier.speedups._speedups (see
 * module.c): dispatch_batch, the C twin of dispatch.py's, with the
 * common path of Applier.dispatch inlined.
 */
#include "speedups.h"

/* Flag: a stop request the caller owns and dispatch_batch reads without a call
 * (a Python call per message cost the loop ~70 ns). */
typedef struct {
    PyObject_HEAD
    int on;
} FlagObject;

static int
flag_bool(PyObject *self)
{
    return ((FlagObject *)self)->on;
}

static PyObject *
flag_set(PyObject *self, PyObject *unused)
{
    ((FlagObject *)self)->on = 1;
    Py_RETURN_NONE;
}

static PyObject *
flag_clear(PyObject *self, PyObject *unused)
{
    ((FlagObject *)self)->on = 0;
    Py_RETURN_NONE;
}

static PyNumberMethods flag_as_number = {.nb_bool = flag_bool};

static PyMethodDef flag_methods[] = {
    {"set", flag_set, METH_NOARGS, "Ask for the stop."},
    {"clear", flag_clear, METH_NOARGS, "Take the request back."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject spd_flag_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "applier.speedups._speedups.Flag",
    .tp_basicsize = sizeof(FlagObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Flag(): false until set(); dispatch_batch stops once it is true.",
    .tp_new = PyType_GenericNew,
    .tp_as_number = &flag_as_number,
    .tp_methods = flag_methods,
};

/* The callable for (lsn, msg): the handler when handlers[type(msg)] is
 * (states, handler) and open_state() is in states; else `fallback`. A new
 * reference, or NULL with an exception set. */
static PyObject *
callee(PyObject *msg, PyObject *handlers, PyObject *open_state, PyObject *fallback)
{
    PyObject *entry = PyDict_GetItemWithError(handlers, (PyObject *)Py_TYPE(msg));
    if (entry == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(fallback);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2)
        return Py_NewRef(fallback);
    Py_INCREF(entry); /* open_state() is Python code: it may change handlers */
    PyObject *call = NULL, *state = PyObject_CallNoArgs(open_state);
    /* Python's `in`, as Applier.dispatch's (a frozenset's lookup, as fast as
     * PySet_Contains, which refused any other container with a SystemError). */
    int ok = state == NULL ? -1 : PySequence_Contains(PyTuple_GET_ITEM(entry, 0), state);
    Py_XDECREF(state);
    if (ok >= 0)
        call = Py_NewRef(ok ? PyTuple_GET_ITEM(entry, 1) : fallback);
    Py_DECREF(entry);
    return call;
}

/* A batch's item as a new reference to a 2-tuple, unpacked as its twin's `for
 * lsn, msg in batch` unpacks it (an item that is not a tuple of two: any
 * iterable of two); NULL with its errors: TypeError for what is not iterable,
 * ValueError for another number of values. */
static PyObject *
pair(PyObject *item)
{
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2)
        return Py_NewRef(item);
    PyObject *t = PySequence_Tuple(item);
    if (t == NULL || PyTuple_GET_SIZE(t) == 2)
        return t;
    PyErr_Format(PyExc_ValueError, "dispatch_batch: an item of %zd values, not (lsn, msg)",
                 PyTuple_GET_SIZE(t));
    Py_DECREF(t);
    return NULL;
}

/* dispatch_batch(batch, handlers, open_state, fallback, stop) -> None
 *
 * For each (lsn, msg) of the list `batch`, in order, calls handler(lsn, msg)
 * when handlers[type(msg)] is (states, handler) and open_state() is in states:
 * open_state() gives the session's state when Applier.dispatch's common path
 * is open (no live transaction it might drop), else None. That path raises
 * nothing and drops no live transaction. Any other message goes to
 * fallback(lsn, msg) (Applier.dispatch itself), which raises the ProtocolError
 * or drops the live transaction as it does. After each message, stops when
 * the Flag `stop` is set. An exception of a call propagates at once. The caller
 * passes what is read as a callable and a Flag: no attribute of its objects is
 * read here.
 */
PyObject *
spd_dispatch_batch(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1]) ||
        !PyObject_TypeCheck(args[4], &spd_flag_type)) {
        PyErr_SetString(PyExc_TypeError,
                        "dispatch_batch(batch: list, handlers: dict, open_state, fallback, "
                        "stop: Flag)");
        return NULL;
    }
    PyObject *batch = args[0], *handlers = args[1], *open_state = args[2];
    PyObject *fallback = args[3];
    FlagObject *stop = (FlagObject *)args[4];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(batch); i++) {
        /* Held: a handler may drop the batch's last reference. */
        PyObject *item = pair(PyList_GET_ITEM(batch, i));
        if (item == NULL)
            return NULL;
        PyObject *argv[2] = {PyTuple_GET_ITEM(item, 0), PyTuple_GET_ITEM(item, 1)};
        PyObject *call = callee(argv[1], handlers, open_state, fallback);
        PyObject *r = NULL;
        if (call != NULL) {
            r = PyObject_Vectorcall(call, argv, 2, NULL);
            Py_DECREF(call);
        }
        Py_DECREF(item);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        if (stop->on)
            break;
    }
    Py_RETURN_NONE;
}

/* Flag ready to be added to the module: 0, or -1 with an exception set. */
int
spd_dispatch_init(void)
{
    return PyType_Ready(&spd_flag_type);
}
