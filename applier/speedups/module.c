/*
 * applier.speedups._speedups: the hot loops of the protocol, the stream and the
 * apply worker, in C, each file beside the Python twin it is named after.
 *
 * One module built from several files (hatch_build.py compiles them all into
 * the one extension), split along these seams; speedups.h declares what they
 * share. This file holds only the module definition.
 *
 * Each function computes exactly what its pure-Python twin computes, takes
 * the argument types it takes (data: bytes, bytearray or memoryview) and
 * raises the exception types it raises (the twins stay the reference and the
 * fallback; applier/speedups/__init__.py chooses, tests/protocol/test_speedups.py
 * checks them equal, on random and malformed input):
 *
 * tuples.c, TupleData reading:
 *
 *   tuple_data(data, pos)   tuples.py's: a TupleData without the error reporting:
 *                           (kinds, values, end), or None when the TupleData
 *                           is malformed (the caller then walks it again with
 *                           tuples._tuple_error for the precise DecodeError).
 *
 * copyrun.c, COPY framing:
 *
 *   copy_text_row(values)   copyrun.py's: one line of COPY text.
 *   copy_binary_row(values) copyrun.py's: one tuple of COPY binary.
 *   tuple_text_line(data, pos)
 *                           copyrun.py's tuple_text_line: an INSERT's TupleData
 *                           straight to its COPY text line (the copy lane).
 *   tuple_text_lines(datas, start, pos, width, limit)
 *                           copyrun.py's tuple_text_lines: the same for a run
 *                           of such messages, joined.
 *
 * takeloop.c and readahead.c, the stream client's read loops:
 *
 *   take_xlog(get, table, decode, out, room, lsn_type, state[, group])
 *                           the stream client's loop over the CopyData libpq
 *                           has buffered (takeloop.py's):
 *                           XLogData decoded into out, anything else handed
 *                           back to the caller; with `group`, runs of streamed
 *                           row changes of one head as one item.
 *   fill_copy(consume, get, data, lens, room)
 *                           readahead.py's: what libpq can
 *                           read from the socket, packed into two bytearrays.
 *
 * mergelane.c, the merge lane's loop:
 *
 *   hold_rows(datas, lsns, start, width, key, rows, keys, txn, no, size,
 *             max_rows, max_bytes)
 *                           mergelane.py's: a run of streamed UPDATEs
 *                           or DELETEs held by key until one it leaves.
 *
 * decoder.c, transaction and row messages outside stream blocks:
 *
 *   bind_rows(Begin, Commit, Insert, Update, Delete, TupleData, Lsn, twins)
 *                           once, by the decoder: the classes to build and the
 *                           Python twins that take what C does not decode.
 *   decode_begin(data), decode_commit(data), decode_insert(data),
 *   decode_update(data), decode_delete(data)
 *                           decoder._begin, _commit, _insert, _update, _delete.
 *
 * dispatch.c, the apply worker's loop over a batch:
 *
 *   dispatch_batch(batch, handlers, open_state, fallback, stop)
 *                           dispatch.py's: Worker._dispatch's loop with the common path of
 *                           handlers.Applier.dispatch (the rest: fallback).
 *
 * Only the stable C API is used and nothing is kept between calls but the
 * shared all-text kinds objects, struct.error and
 * what bind_rows gave, set once at import, so there is no state to reason about.
 */
#include "speedups.h"

static PyMethodDef methods[] = {
    {"tuple_data", (PyCFunction)(void (*)(void))spd_tuple_data, METH_FASTCALL,
     "tuple_data(data, pos) -> (kinds, values, end) or None if malformed"},
    {"copy_text_row", spd_copy_text_row, METH_O, "copy_text_row(values) -> one COPY text line"},
    {"tuple_text_line", (PyCFunction)(void (*)(void))spd_tuple_text_line, METH_FASTCALL,
     "tuple_text_line(data, pos) -> (COPY text line, width) or (None, -1)"},
    {"copy_binary_row", spd_copy_binary_row, METH_O,
     "copy_binary_row(values) -> one COPY binary tuple"},
    {"take_xlog", (PyCFunction)(void (*)(void))spd_take_xlog, METH_FASTCALL,
     "take_xlog(get, table, decode, out, room, lsn_type, state[, group]) -> status (see "
     "takeloop.c)"},
    {"dispatch_batch", (PyCFunction)(void (*)(void))spd_dispatch_batch, METH_FASTCALL,
     "dispatch_batch(batch, handlers, open_state, fallback, stop) -> None (see dispatch.c)"},
    {"fill_copy", (PyCFunction)(void (*)(void))spd_fill_copy, METH_FASTCALL,
     "fill_copy(consume, get, data, lens, room) -> status (see the source)"},
    {"tuple_text_lines", (PyCFunction)(void (*)(void))spd_tuple_text_lines, METH_FASTCALL,
     "tuple_text_lines(datas, start, pos, width, limit) -> (COPY text lines, count)"},
    {"hold_rows", (PyCFunction)(void (*)(void))spd_hold_rows, METH_FASTCALL,
     "hold_rows(datas, lsns, start, width, key, rows, keys, txn, no, size, max_rows, "
     "max_bytes) -> (count, size)"},
    {"bind_rows", (PyCFunction)(void (*)(void))spd_bind_rows, METH_FASTCALL,
     "bind_rows(Begin, Commit, Insert, Update, Delete, TupleData, Lsn, twins) -> None"},
    {"decode_begin", spd_decode_begin, METH_O, "decode_begin(data) -> Begin"},
    {"decode_commit", spd_decode_commit, METH_O, "decode_commit(data) -> Commit"},
    {"decode_insert", spd_decode_insert, METH_O, "decode_insert(data) -> Insert"},
    {"decode_update", spd_decode_update, METH_O, "decode_update(data) -> Update"},
    {"decode_delete", spd_decode_delete, METH_O, "decode_delete(data) -> Delete"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "applier.speedups._speedups",
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
    if (spd_tuples_init() < 0 || spd_copyframe_init() < 0 || spd_dispatch_init() < 0)
        return NULL;
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL)
        return NULL;
    Py_INCREF(&spd_flag_type);
    if (PyModule_AddObject(module, "Flag", (PyObject *)&spd_flag_type) < 0) {
        Py_DECREF(&spd_flag_type);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
