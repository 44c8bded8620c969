/*
 * The stream's read loop for applier.speedups._speedups (see module.c):
 * take_xlog, the C twin of takeloop.py's (used by applier/stream/takeloop.py).
 */
#include "copydata.h"

/* take_xlog(get, table, decode, out, room, lsn_type, state[, group]) -> status
 *
 * Calls get() (psycopg's PGconn.get_copy_data with async=1 bound; or reads a
 * fill of the stream's read-ahead in place, see Chunk) while it returns a message and
 * fewer than `room` XLogData went into `out`; each XLogData goes in as
 * (lsn_type(wal_start), table[payload[0]](payload)), or through decode(payload)
 * when the table cannot index it (an empty payload). `table` is the decoder's
 * list of handlers by tag (PgOutputDecoder.handlers), indexed per message: the
 * handlers of Stream Start/Stop rewrite it in place.
 *
 * `state` is [count, nbytes, last, failed_lsn, other, sent], carried across
 * calls and written back on every return, errors included: messages and bytes
 * taken, the highest wal_end seen, the wal_start of a message whose handler
 * raised, the message returned for the caller, and the send_time of the last
 * XLogData taken (the server's clock; what tells the worker it is behind).
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
 *
 * With `group` = (StreamedChange, StreamedRun, Insert, InsertRun), Inserts
 * outside stream blocks are gathered the same way by their first
 * PLAIN_HEAD bytes (tag, relation, 'N'), from the second on: the item of the
 * first (decoded as ever) becomes (its lsn, InsertRun(first, datas, lsns)),
 * datas and lsns those of the Inserts after it. The first's bytes are not
 * kept (its Insert holds its values): a lone Insert costs what it did.
 */
#define GROUP_HEAD 10
#define PLAIN_HEAD 6

static int
put_state(PyObject *state, Py_ssize_t count, Py_ssize_t nbytes, unsigned long long last,
          long long sent)
{
    PyObject *v;
    if ((v = PyLong_FromLongLong(sent)) == NULL || PyList_SetItem(state, 5, v) < 0)
        return -1;
    if ((v = PyLong_FromSsize_t(count)) == NULL || PyList_SetItem(state, 0, v) < 0)
        return -1;
    if ((v = PyLong_FromSsize_t(nbytes)) == NULL || PyList_SetItem(state, 1, v) < 0)
        return -1;
    if ((v = PyLong_FromUnsignedLongLong(last)) == NULL || PyList_SetItem(state, 2, v) < 0)
        return -1;
    return 0;
}

/* The handler for `payload`: table[tag], or `decode` when the table has no
 * entry for it (an empty payload). A new reference. */
static PyObject *
handler_for(PyObject *table, PyObject *decode, PyObject *payload)
{
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    if (size > 0) {
        unsigned char tag = (unsigned char)PyBytes_AS_STRING(payload)[0];
        if (tag < PyList_GET_SIZE(table))
            return Py_NewRef(PyList_GET_ITEM(table, tag));
    }
    return Py_NewRef(decode);
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

/* run_type(first, [payload], [start]), taking the reference to `first`; the
 * run's lists and its first `head_len` bytes go to the caller's. NULL with an
 * exception. */
static PyObject *
start_run(PyObject *first, PyObject *payload, unsigned long long start, PyObject *run_type,
          PyObject **datas, PyObject **lsns, unsigned char *head, Py_ssize_t head_len)
{
    if (first == NULL)
        return NULL;
    PyObject *d = PyList_New(1), *l = PyList_New(1);
    PyObject *at = PyLong_FromUnsignedLongLong(start);
    PyObject *run = NULL;
    if (d != NULL && l != NULL && at != NULL) {
        Py_INCREF(payload);
        PyList_SET_ITEM(d, 0, payload);
        PyList_SET_ITEM(l, 0, at);
        at = NULL;
        run = PyObject_CallFunctionObjArgs(run_type, first, d, l, NULL);
    }
    Py_XDECREF(at);
    Py_DECREF(first);
    if (run == NULL) {
        Py_XDECREF(d);
        Py_XDECREF(l);
        return NULL;
    }
    /* The caller's references, not borrowed from the run: Python code runs before
     * the next row is appended (get(), a collection), and may drop the run. */
    *datas = d;
    *lsns = l;
    if (head != NULL)
        memcpy(head, PyBytes_AS_STRING(payload), (size_t)head_len);
    return run;
}

/* Turn out's last item, (lsn, Insert), into (lsn, insert_run(Insert, [payload],
 * [start])); the run's lists go to the caller's. 0, 1 when out's last item is
 * no longer that (Python code, get(), changed out: no run then), or -1 with an
 * exception. */
static int
start_insert_run(PyObject *out, PyObject *payload, unsigned long long start,
                 PyObject *insert_type, PyObject *insert_run, PyObject **datas, PyObject **lsns)
{
    Py_ssize_t last_at = PyList_GET_SIZE(out) - 1;
    if (last_at < 0)
        return 1;
    PyObject *last = PyList_GET_ITEM(out, last_at);
    if (!PyTuple_Check(last) || PyTuple_GET_SIZE(last) != 2 ||
        Py_TYPE(PyTuple_GET_ITEM(last, 1)) != (PyTypeObject *)insert_type)
        return 1;
    /* Held, not borrowed: insert_run is Python code, and may drop it from out. */
    PyObject *item = Py_NewRef(PyList_GET_ITEM(out, last_at));
    PyObject *first = PyTuple_GET_ITEM(item, 1);
    Py_INCREF(first);
    PyObject *run = start_run(first, payload, start, insert_run, datas, lsns, NULL, 0);
    PyObject *replaced = run == NULL ? NULL : PyTuple_Pack(2, PyTuple_GET_ITEM(item, 0), run);
    Py_XDECREF(run);
    Py_DECREF(item);
    if (replaced == NULL)
        return -1;
    return PyList_SetItem(out, last_at, replaced); /* steals; drops the old item */
}

/* A fill of the stream's read-ahead (applier.stream.readahead), read in place:
 * `get` is then the list [data, lens, i, pos] (the messages' bytes end to end,
 * their lengths in an array('q'), the next one's index and offset), which is
 * written back on return; no object is made per message but its payload. */
typedef struct {
    int on;
    PyObject *cursor;
    Py_buffer data, lens;
    Py_ssize_t i, pos, count;
} Chunk;

static int
chunk_open(Chunk *c, PyObject *get)
{
    c->on = 0;
    if (!PyList_Check(get))
        return 0;
    if (PyList_GET_SIZE(get) != 4) {
        PyErr_SetString(PyExc_TypeError, "take_xlog: a chunk is [data, lens, i, pos]");
        return -1;
    }
    if (PyObject_GetBuffer(PyList_GET_ITEM(get, 0), &c->data, PyBUF_SIMPLE) < 0)
        return -1;
    if (PyObject_GetBuffer(PyList_GET_ITEM(get, 1), &c->lens, PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&c->data);
        return -1;
    }
    c->i = PyLong_AsSsize_t(PyList_GET_ITEM(get, 2));
    c->pos = PyLong_AsSsize_t(PyList_GET_ITEM(get, 3));
    if (c->lens.itemsize != 8 || c->lens.format == NULL || strcmp(c->lens.format, "q") != 0 ||
        c->i < 0 || c->pos < 0) {
        PyBuffer_Release(&c->data);
        PyBuffer_Release(&c->lens);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "take_xlog: a chunk's lens must be an array('q')");
        return -1;
    }
    c->count = c->lens.len / 8;
    c->cursor = get;
    c->on = 1;
    return 0;
}

/* The next message of the chunk: its length (0 at the end, -1 with an error). */
static Py_ssize_t
chunk_next(Chunk *c, const unsigned char **buf)
{
    if (c->i >= c->count)
        return 0;
    long long n = ((const long long *)c->lens.buf)[c->i];
    if (n <= 0 || n > c->data.len - c->pos) {
        PyErr_SetString(PyExc_ValueError, "take_xlog: a chunk's lengths overrun its data");
        return -1;
    }
    *buf = (const unsigned char *)c->data.buf + c->pos;
    c->i += 1;
    c->pos += (Py_ssize_t)n;
    return (Py_ssize_t)n;
}

/* Write the chunk's position back and release it: 0, or -1 with an error. */
static int
chunk_close(Chunk *c)
{
    if (!c->on)
        return 0;
    c->on = 0;
    PyBuffer_Release(&c->data);
    PyBuffer_Release(&c->lens);
    PyObject *i = PyLong_FromSsize_t(c->i), *pos = PyLong_FromSsize_t(c->pos);
    if (i == NULL || pos == NULL) {
        Py_XDECREF(i);
        Py_XDECREF(pos);
        return -1;
    }
    PyList_SetItem(c->cursor, 2, i); /* steal */
    PyList_SetItem(c->cursor, 3, pos);
    return 0;
}

PyObject *
spd_take_xlog(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7 && nargs != 8) {
        PyErr_SetString(PyExc_TypeError,
                        "take_xlog(get, table, decode, out, room, lsn_type, state[, group]) "
                        "takes 7 or 8 arguments");
        return NULL;
    }
    PyObject *get = args[0], *table = args[1], *decode = args[2], *out = args[3];
    PyObject *lsn_type = args[5], *state = args[6];
    PyObject *change_type = NULL, *run_type = NULL, *insert_type = NULL, *insert_run = NULL;
    if (!PyList_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "take_xlog: table must be a list");
        return NULL;
    }
    if (nargs == 8 && args[7] != Py_None) {
        if (!PyTuple_Check(args[7]) || PyTuple_GET_SIZE(args[7]) != 4) {
            PyErr_SetString(PyExc_TypeError,
                            "take_xlog: group must be (StreamedChange, StreamedRun, Insert, "
                            "InsertRun)");
            return NULL;
        }
        change_type = PyTuple_GET_ITEM(args[7], 0);
        run_type = PyTuple_GET_ITEM(args[7], 1);
        insert_type = PyTuple_GET_ITEM(args[7], 2);
        insert_run = PyTuple_GET_ITEM(args[7], 3);
    }
    /* The lists of the run being gathered (our references: see start_run). */
    PyObject *run_datas = NULL, *run_lsns = NULL;
    unsigned char run_head[GROUP_HEAD];
    Py_ssize_t head_len = GROUP_HEAD;
    /* The last item is a lone Insert outside a stream block with this head: the
     * next Insert with the same head turns it into an InsertRun. */
    int lone_insert = 0;
    unsigned char lone_head[PLAIN_HEAD];
    if (!PyList_Check(out) || !PyList_Check(state) || PyList_GET_SIZE(state) != 6) {
        PyErr_SetString(PyExc_TypeError, "take_xlog: out must be a list, state a list of 6");
        return NULL;
    }
    Py_ssize_t room = PyLong_AsSsize_t(args[4]);
    if (room == -1 && PyErr_Occurred())
        return NULL;
    unsigned long long last = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(state, 2));
    if (last == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(PyList_GET_ITEM(state, 0));
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyList_GET_ITEM(state, 1));
    if ((count == -1 || nbytes == -1) && PyErr_Occurred())
        return NULL;
    long long sent = PyLong_AsLongLong(PyList_GET_ITEM(state, 5));
    if (sent == -1 && PyErr_Occurred())
        return NULL;
    long status = 0;
    Chunk chunk;
    if (chunk_open(&chunk, get) < 0)
        goto error;
    while (room > 0) {
        const unsigned char *buf;
        Py_ssize_t n, len;
        PyObject *got = NULL; /* get()'s (n, data), when not reading a chunk */
        Py_buffer view;
        if (chunk.on) {
            if ((n = chunk_next(&chunk, &buf)) < 0)
                goto error;
            if (n == 0)
                break;
            len = n;
        } else {
            got = PyObject_CallNoArgs(get);
            if (got == NULL)
                goto error;
            if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 2) {
                Py_DECREF(got);
                PyErr_SetString(PyExc_TypeError, "take_xlog: get() must return (n, data)");
                goto error;
            }
            n = PyLong_AsSsize_t(PyTuple_GET_ITEM(got, 0));
            if (n == -1 && PyErr_Occurred()) {
                Py_DECREF(got);
                goto error;
            }
            if (n <= 0) {
                Py_DECREF(got);
                status = n == -1 ? 1 : 0;
                break;
            }
            if (PyObject_GetBuffer(PyTuple_GET_ITEM(got, 1), &view, PyBUF_SIMPLE) < 0) {
                Py_DECREF(got);
                goto error;
            }
            buf = (const unsigned char *)view.buf;
            len = view.len;
        }
        count += 1;
        nbytes += n;
        XLogHeader h;
        if (!xlog_header(buf, len, &h)) {
            PyObject *data;
            if (got != NULL) {
                PyBuffer_Release(&view);
                data = PyTuple_GET_ITEM(got, 1);
                Py_INCREF(data);
                Py_DECREF(got);
            } else if ((data = PyBytes_FromStringAndSize((const char *)buf, len)) == NULL) {
                goto error;
            }
            if (PyList_SetItem(state, 4, data) < 0)
                goto error;
            status = 2;
            break;
        }
        unsigned long long start = h.wal_start, end = h.wal_end;
        sent = h.send_time;
        PyObject *payload = PyBytes_FromStringAndSize((const char *)buf + XLOG_HEADER,
                                                      len - XLOG_HEADER);
        if (got != NULL) {
            PyBuffer_Release(&view);
            Py_DECREF(got);
        }
        if (payload == NULL)
            goto error;
        if (run_datas != NULL && PyBytes_GET_SIZE(payload) >= head_len &&
            memcmp(PyBytes_AS_STRING(payload), run_head, (size_t)head_len) == 0) {
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
        Py_CLEAR(run_datas);
        Py_CLEAR(run_lsns);
        if (lone_insert && PyBytes_GET_SIZE(payload) >= PLAIN_HEAD &&
            memcmp(PyBytes_AS_STRING(payload), lone_head, PLAIN_HEAD) == 0) {
            lone_insert = 0;
            int started = start_insert_run(out, payload, start, insert_type, insert_run,
                                           &run_datas, &run_lsns);
            if (started < 0) {
                Py_DECREF(payload);
                goto error;
            }
            if (started == 0) {
                Py_DECREF(payload);
                memcpy(run_head, lone_head, PLAIN_HEAD);
                head_len = PLAIN_HEAD;
                room -= 1;
                if (end > last)
                    last = end;
                continue;
            }
        }
        lone_insert = 0;
        PyObject *handler = handler_for(table, decode, payload);
        PyObject *msg = PyObject_CallOneArg(handler, payload);
        Py_DECREF(handler);
        if (msg != NULL && run_type != NULL) {
            if (Py_TYPE(msg) == (PyTypeObject *)change_type && groupable(payload)) {
                head_len = GROUP_HEAD;
                /* The StreamedChange's xid, read where its handler read it. */
                PyObject *xid = PyLong_FromUnsignedLong(
                    read_u32((const unsigned char *)PyBytes_AS_STRING(payload) + 1));
                Py_DECREF(msg);
                msg = start_run(xid, payload, start, run_type, &run_datas, &run_lsns, run_head,
                                head_len);
            }
            else if (Py_TYPE(msg) == (PyTypeObject *)insert_type &&
                     PyBytes_GET_SIZE(payload) >= PLAIN_HEAD &&
                     PyBytes_AS_STRING(payload)[PLAIN_HEAD - 1] == 'N') {
                lone_insert = 1;
                memcpy(lone_head, PyBytes_AS_STRING(payload), PLAIN_HEAD);
            }
        }
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
    Py_XDECREF(run_datas);
    Py_XDECREF(run_lsns);
    if (chunk_close(&chunk) < 0 || put_state(state, count, nbytes, last, sent) < 0)
        return NULL;
    return PyLong_FromLong(status);

error:
    Py_XDECREF(run_datas);
    Py_XDECREF(run_lsns);
    {
        PyObject *exc_type, *exc_value, *exc_tb;
        PyErr_Fetch(&exc_type, &exc_value, &exc_tb);
        if (chunk_close(&chunk) < 0 || put_state(state, count, nbytes, last, sent) < 0)
            PyErr_Clear();
        PyErr_Restore(exc_type, exc_value, exc_tb);
    }
    return NULL;
}
