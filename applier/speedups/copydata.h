/*
 * The CopyData framing of START_REPLICATION, in C: the one definition the C
 * files share (the Python one is applier/protocol/copydata.py, whose
 * docstring has the byte layout):
 *
 *   XLogData   'w' Int64 wal_start, Int64 wal_end, Int64 send_time, Byte[n] payload
 *
 * A keepalive ('k') and anything else go back to Python, which parses or
 * names them (copydata.parse_copydata).
 */
#ifndef APPLIER_COPYDATA_H
#define APPLIER_COPYDATA_H

#include "speedups.h"

/* Bytes before an XLogData's payload: the tag and three Int64. */
#define XLOG_HEADER 25

typedef struct {
    unsigned long long wal_start, wal_end;
    long long send_time;
} XLogHeader;

static inline unsigned long long
read_u64(const unsigned char *p)
{
    return (unsigned long long)read_u32(p) << 32 | read_u32(p + 4);
}

/* 1 and the header in *h when buf[0:len] is an XLogData with its whole header
 * (the payload starts at buf + XLOG_HEADER), else 0. */
static inline int
xlog_header(const unsigned char *buf, Py_ssize_t len, XLogHeader *h)
{
    if (len < XLOG_HEADER || buf[0] != 'w')
        return 0;
    h->wal_start = read_u64(buf + 1);
    h->wal_end = read_u64(buf + 9);
    h->send_time = (long long)read_u64(buf + 17);
    return 1;
}

#endif
