/* The compiled core of tpudiag.parsers.event_wire: read an XLine's events from its wire bytes.
 *
 * A field is a varint tag (number << 3 | wire type), then a varint (type 0), 8 bytes (1), a
 * varint length and that many bytes (2) or 4 bytes (5). Every read is bounds-checked: trace
 * bytes are untrusted. Anything this reader does not read exactly as upb would (damaged framing,
 * a known field with another wire type, a group, a value past int64 where it is used, a non-ASCII
 * string, a non-string key) makes it answer "not plain" and the caller reads the line through
 * protobuf instead. The field numbers are those of tpudiag/proto/schema.py: XLine.events = 4;
 * XEvent metadata_id 1, offset_ps 2, duration_ps 3, stats 4, num_occurrences 5 (offset_ps and
 * num_occurrences share a oneof); XStat metadata_id 1, then one value of double 2, uint64 3,
 * int64 4, str 5, bytes 6, ref 7, compressed str 8.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_FIELD 536870911u /* 2^29 - 1: larger field numbers are invalid */

typedef Py_ssize_t Pos;

static inline int read_varint(const uint8_t *b, Pos *pos, Pos end, uint64_t *out)
{
    Pos p = *pos;
    if (p < end && b[p] < 0x80) { /* most tags and ids: one byte */
        *out = b[p];
        *pos = p + 1;
        return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end)
            return -1;
        uint8_t c = b[p++];
        v |= (uint64_t)(c & 0x7F) << (7 * i);
        if (c < 0x80) {
            if (i == 9 && c > 1) /* more than 64 bits */
                return -1;
            *out = v;
            *pos = p;
            return 0;
        }
    }
    return -1;
}

static inline int64_t as_int64(uint64_t v)
{
    int64_t r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* The tag at *pos: its field number and wire type; -1 when malformed or field 0 / too large. */
static inline int read_tag(const uint8_t *b, Pos *pos, Pos end, uint64_t *field, int *wire_type)
{
    uint64_t tag;
    if (read_varint(b, pos, end, &tag))
        return -1;
    *field = tag >> 3;
    *wire_type = (int)(tag & 7);
    return (*field == 0 || *field > MAX_FIELD) ? -1 : 0;
}

static inline int read_length(const uint8_t *b, Pos *pos, Pos end, Pos *start, Pos *stop)
{
    uint64_t n;
    if (read_varint(b, pos, end, &n) || n > (uint64_t)(end - *pos))
        return -1;
    *start = *pos;
    *stop = *pos + (Pos)n;
    *pos = *stop;
    return 0;
}

/* Skips a field's value; groups (wire types 3, 4) and unknown wire types are not plain. */
static inline int skip_value(const uint8_t *b, Pos *pos, Pos end, int wire_type)
{
    uint64_t v;
    Pos a, c;
    switch (wire_type) {
    case 0:
        return read_varint(b, pos, end, &v);
    case 1:
        if (end - *pos < 8)
            return -1;
        *pos += 8;
        return 0;
    case 5:
        if (end - *pos < 4)
            return -1;
        *pos += 4;
        return 0;
    case 2:
        return read_length(b, pos, end, &a, &c);
    default:
        return -1;
    }
}

typedef struct {
    int64_t metadata_id;
    int kind; /* field number of the value seen last (a oneof: the last one wins); 0 for none */
    uint64_t uint_value; /* also a ref's id (kind 7) and a double's bits (kind 2) */
    int64_t int_value;
    Pos str_start, str_stop;
} Stat;

/* A stat's integer as the reference reads it: `uint64_value or int64_value` (0 for other kinds). */
static inline int64_t stat_integer(const Stat *st)
{
    return st->kind == 3 ? as_int64(st->uint_value) : (st->kind == 4 ? st->int_value : 0);
}

static int read_stat(const uint8_t *b, Pos pos, Pos end, Stat *st)
{
    memset(st, 0, sizeof *st);
    while (pos < end) {
        uint64_t field, v;
        int wt, expected = -1;
        if (read_tag(b, &pos, end, &field, &wt))
            return -1;
        if (field == 1 || field == 3 || field == 4 || field == 7)
            expected = 0;
        else if (field == 2)
            expected = 1;
        else if (field == 5 || field == 6 || field == 8)
            expected = 2;
        if (expected >= 0 && wt != expected)
            return -1;
        if (field == 1 || field == 3 || field == 4) {
            if (read_varint(b, &pos, end, &v))
                return -1;
            if (field == 1) {
                st->metadata_id = as_int64(v);
            } else if (field == 3) {
                st->kind = 3;
                st->uint_value = v;
            } else {
                st->kind = 4;
                st->int_value = as_int64(v);
            }
        } else if (field == 5) {
            Pos a, c;
            if (read_length(b, &pos, end, &a, &c))
                return -1;
            for (Pos i = a; i < c; i++)
                if (b[i] >= 0x80) /* upb checks UTF-8 here; leave anything but ASCII to it */
                    return -1;
            st->kind = 5;
            st->str_start = a;
            st->str_stop = c;
        } else if (field == 7) { /* a ref: the id of the stat metadata naming the string */
            if (read_varint(b, &pos, end, &v))
                return -1;
            st->kind = 7;
            st->uint_value = v;
        } else if (field == 2) { /* a double: its 8 bytes, little-endian as on the wire */
            if (end - pos < 8)
                return -1;
            uint64_t bits = 0;
            for (int i = 7; i >= 0; i--)
                bits = bits << 8 | b[pos + i];
            pos += 8;
            st->kind = 2;
            st->uint_value = bits;
        } else {
            if (field == 6 || field == 8)
                st->kind = (int)field;
            if (skip_value(b, &pos, end, wt))
                return -1;
        }
    }
    return 0;
}

/* The header of the XLine in b[0:end] and its number of events: -1 when its framing is not plain.
 * XLine: id 1, name 2, timestamp_ns 3, events 4, duration_ps 9, display_id 10, display_name 11. */
static Py_ssize_t scan_line_in(const uint8_t *b, Pos end, Pos *name_start, Pos *name_stop, int64_t *timestamp_ns)
{
    Pos pos = 0;
    Py_ssize_t n = 0;
    *name_start = *name_stop = 0;
    *timestamp_ns = 0;
    while (pos < end) {
        uint64_t field, v;
        int wt;
        Pos a, c;
        if (read_tag(b, &pos, end, &field, &wt))
            return -1;
        if (field == 1 || field == 3 || field == 9 || field == 10) {
            if (wt != 0 || read_varint(b, &pos, end, &v))
                return -1;
            if (field == 3)
                *timestamp_ns = as_int64(v);
        } else if (field == 2 || field == 11 || field == 4) {
            if (wt != 2 || read_length(b, &pos, end, &a, &c))
                return -1;
            if (field == 4) {
                n++;
                continue;
            }
            for (Pos i = a; i < c; i++)
                if (b[i] >= 0x80) /* upb checks UTF-8 in names; leave anything but ASCII to it */
                    return -1;
            if (field == 2) {
                *name_start = a;
                *name_stop = c;
            }
        } else if (skip_value(b, &pos, end, wt)) {
            return -1;
        }
    }
    return n;
}

static uint64_t fnv1a(const uint8_t *b, Pos start, Pos stop)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (Pos i = start; i < stop; i++)
        h = (h ^ b[i]) * 0x100000001B3ull;
    return h;
}

typedef struct {
    int64_t *mids, *starts, *durs, *key_starts, *key_lengths;
    int8_t *kinds;
    uint64_t *hashes;
} Columns;

typedef struct {
    int timed, has_key;
    long long off_id, dur_id, key_id, base; /* as PyArg_ParseTuple's "L" writes them */
} Params;

/* An event's own scalar fields, as read so far: metadata_id 1, offset_ps 2 (until num_occurrences 5,
 * which replaces it, unsets it), duration_ps 3. */
typedef struct {
    int64_t mid, offset, dur;
    int offset_set;
} EventHead;

/* The next stat of the event in b[*pos:end] into st, reading the event's other fields on the way
 * into h: 1 when a stat was read, 0 at the event's end, -1 when not plain. */
static inline int next_stat(const uint8_t *b, Pos *pos, Pos end, EventHead *h, Stat *st)
{
    while (*pos < end) {
        uint64_t field, v;
        int wt;
        if (read_tag(b, pos, end, &field, &wt))
            return -1;
        if (field == 1 || field == 2 || field == 3 || field == 5) {
            if (wt != 0 || read_varint(b, pos, end, &v))
                return -1;
            if (field == 1)
                h->mid = as_int64(v);
            else if (field == 2) {
                h->offset = as_int64(v);
                h->offset_set = 1;
            } else if (field == 3)
                h->dur = as_int64(v);
            else
                h->offset_set = 0;
        } else if (field == 4) {
            Pos a, c;
            if (wt != 2 || read_length(b, pos, end, &a, &c) || read_stat(b, a, c, st))
                return -1;
            return 1;
        } else if (skip_value(b, pos, end, wt)) {
            return -1;
        }
    }
    return 0;
}

/* One event in b[pos:end] into row i; -1 when not plain. */
static int read_event(const uint8_t *b, Pos pos, Pos end, const Params *p, Columns *out, Py_ssize_t i)
{
    int64_t o = -1, dd = -1;
    int n_stats = 0, found = !p->has_key, r;
    EventHead h = {0, 0, 0, 0};
    Stat first, second, st;
    memset(&first, 0, sizeof first);
    memset(&second, 0, sizeof second);
    if (p->has_key) { /* without a key the key columns may be empty: they are not written */
        out->kinds[i] = 0;
        out->hashes[i] = 0;
        out->key_starts[i] = 0;
        out->key_lengths[i] = 0;
    }
    while ((r = next_stat(b, &pos, end, &h, &st)) > 0) {
        /* A uint64 past int64 on a timespan stat: protobuf's path raises, so let it. */
        if (p->timed && (st.metadata_id == p->off_id || st.metadata_id == p->dur_id) && st.kind == 3
            && st.uint_value > (uint64_t)INT64_MAX)
            return -1;
        int64_t value = stat_integer(&st);
        if (n_stats == 0)
            first = st;
        else if (n_stats == 1)
            second = st;
        n_stats++;
        if (p->timed) {
            if (st.metadata_id == p->off_id)
                o = value;
            else if (st.metadata_id == p->dur_id)
                dd = value;
        }
        if (!found && st.metadata_id == p->key_id) {
            found = 1;
            if (st.kind == 5) {
                if (st.str_stop > st.str_start) {
                    out->kinds[i] = 1;
                    out->key_starts[i] = st.str_start;
                    out->key_lengths[i] = st.str_stop - st.str_start;
                    out->hashes[i] = fnv1a(b, st.str_start, st.str_stop);
                }
            } else if (st.kind != 0) {
                return -1; /* a non-string key: the reference path decodes it */
            }
        }
    }
    if (r < 0)
        return -1;
    int64_t s, d;
    if (p->timed && n_stats > 1 && first.metadata_id == p->off_id && second.metadata_id == p->dur_id) {
        /* The reference reads the first two stats as is when they are the device timespan. */
        int64_t fv = stat_integer(&first);
        d = stat_integer(&second);
        if (__builtin_add_overflow((int64_t)p->base, fv, &s))
            return -1;
    } else if (p->timed && o >= 0 && dd >= 0) {
        d = dd;
        if (__builtin_add_overflow((int64_t)p->base, o, &s))
            return -1;
    } else {
        d = h.dur;
        if (__builtin_add_overflow((int64_t)p->base, h.offset_set ? h.offset : 0, &s))
            return -1;
    }
    out->mids[i] = h.mid;
    out->starts[i] = s;
    out->durs[i] = d;
    return 0;
}

static PyObject *scan_line(PyObject *self, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*", &data))
        return NULL;
    Pos a, c;
    int64_t timestamp_ns;
    const char *b = data.buf;
    Py_ssize_t n;
    /* A line's header is read by walking every event's tag: millions on a big line. The buffer
     * is held, so other threads (the command's imports, the other plane) run Python meanwhile. */
    Py_BEGIN_ALLOW_THREADS
    n = scan_line_in((const uint8_t *)b, data.len, &a, &c, &timestamp_ns);
    Py_END_ALLOW_THREADS
    PyObject *result = n < 0 ? Py_NewRef(Py_None)
                             : Py_BuildValue("(nNL)", n, PyUnicode_DecodeASCII(b + a, c - a, "strict"),
                                             (long long)timestamp_ns);
    PyBuffer_Release(&data);
    return result;
}

/* Splits a message's top-level fields: the values of field `number` (length-delimited) as
 * (start, stop) spans, and every other field copied, in order, into `rest`. Parsing `rest` with
 * protobuf then reads the message as if it had no field `number`, without copying the big values
 * (an XSpace's planes, an XPlane's lines). None when the framing is not plain. */
static PyObject *split_field(PyObject *self, PyObject *args)
{
    Py_buffer data;
    unsigned long long number;
    if (!PyArg_ParseTuple(args, "y*K", &data, &number))
        return NULL;
    const uint8_t *b = data.buf;
    Pos pos = 0, end = data.len, rest_len = 0;
    PyObject *spans = NULL, *rest = NULL, *result = NULL;
    uint8_t *out = PyMem_Malloc((size_t)(end ? end : 1));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    spans = PyList_New(0);
    if (spans == NULL)
        goto done;
    while (pos < end) {
        uint64_t field;
        int wt;
        Pos at = pos, a, c;
        if (read_tag(b, &pos, end, &field, &wt))
            goto plain_no;
        if (field == number) {
            if (wt != 2 || read_length(b, &pos, end, &a, &c))
                goto plain_no;
            PyObject *span = Py_BuildValue("(nn)", a, c);
            if (span == NULL || PyList_Append(spans, span)) {
                Py_XDECREF(span);
                goto done;
            }
            Py_DECREF(span);
        } else {
            if (skip_value(b, &pos, end, wt))
                goto plain_no;
            memcpy(out + rest_len, b + at, (size_t)(pos - at));
            rest_len += pos - at;
        }
    }
    rest = PyBytes_FromStringAndSize((const char *)out, rest_len);
    if (rest != NULL)
        result = PyTuple_Pack(2, spans, rest);
    goto done;
plain_no:
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(out);
    Py_XDECREF(spans);
    Py_XDECREF(rest);
    PyBuffer_Release(&data);
    return result;
}

static int column(Py_buffer *buf, Py_ssize_t n, Py_ssize_t itemsize, const char *name)
{
    if (buf->len != n * itemsize) {
        PyErr_Format(PyExc_ValueError, "column %s holds %zd bytes, not %zd", name, buf->len, n * itemsize);
        return -1;
    }
    return 0;
}

/* Calls `read` on each event (XLine field 4) of the XLine in b[0:end], with its index: 1 when
 * every field is plain and there are exactly n events, all read; 0 otherwise. */
typedef int (*EventReader)(const uint8_t *b, Pos pos, Pos end, Py_ssize_t i, void *job);

static int for_each_event(const uint8_t *b, Pos end, Py_ssize_t n, EventReader read, void *job)
{
    Pos pos = 0;
    Py_ssize_t i = 0;
    int ok = 1;
    while (pos < end && ok) {
        uint64_t field;
        int wt;
        if (read_tag(b, &pos, end, &field, &wt)) {
            ok = 0;
        } else if (field != 4) {
            ok = !skip_value(b, &pos, end, wt);
        } else {
            Pos a, c;
            ok = wt == 2 && i < n && !read_length(b, &pos, end, &a, &c) && !read(b, a, c, i, job);
            i++;
        }
    }
    return ok && i == n;
}

/* for_each_event without the GIL (the buffers are held: other threads may run Python meanwhile),
 * as a Python bool. */
static PyObject *run_on_events(const Py_buffer *data, Py_ssize_t n, EventReader read, void *job)
{
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = for_each_event((const uint8_t *)data->buf, data->len, n, read, job);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

typedef struct {
    Columns out;
    Params p;
} EventsJob;

static int events_job(const uint8_t *b, Pos pos, Pos end, Py_ssize_t i, void *job)
{
    EventsJob *j = job;
    return read_event(b, pos, end, &j->p, &j->out, i);
}

static PyObject *decode_events(PyObject *self, PyObject *args)
{
    Py_buffer data, bm, bs, bd, bk, bh, bks, bkl;
    Params p;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*nw*w*w*w*w*w*w*pLLpLL", &data, &n, &bm, &bs, &bd, &bk, &bh, &bks, &bkl,
                          &p.timed, &p.off_id, &p.dur_id, &p.has_key, &p.key_id, &p.base))
        return NULL;
    PyObject *result = NULL;
    Py_buffer *cols[] = {&bm, &bs, &bd, &bk, &bh, &bks, &bkl};
    if (column(&bm, n, 8, "mids") || column(&bs, n, 8, "starts") || column(&bd, n, 8, "durs")
        || (p.has_key && (column(&bk, n, 1, "kinds") || column(&bh, n, 8, "hashes")
                          || column(&bks, n, 8, "key_starts") || column(&bkl, n, 8, "key_lengths"))))
        goto done;
    EventsJob job = {{bm.buf, bs.buf, bd.buf, bks.buf, bkl.buf, bk.buf, bh.buf}, p};
    result = run_on_events(&data, n, events_job, &job);
done:
    PyBuffer_Release(&data);
    for (size_t k = 0; k < sizeof cols / sizeof cols[0]; k++)
        PyBuffer_Release(cols[k]);
    return result;
}

/* The stats `ids[0..k)` of one event in b[pos:end] into row i: for stat j, kinds[i*k+j] its value's
 * field number, seqs[i*k+j] its position among the event's stats (1-based; 0: absent; the last
 * of repeated ids wins), values[i*k+j] its integer, ref id, double bits or string start, and
 * lengths[i*k+j] a string's length. -1 when not plain. */
typedef struct {
    const int64_t *ids;
    Py_ssize_t k;
    int64_t *mids, *offsets, *values, *lengths;
    int8_t *kinds;
    int32_t *seqs;
} StatsJob;

static int stats_job(const uint8_t *b, Pos pos, Pos end, Py_ssize_t i, void *job)
{
    const StatsJob *t = job;
    const int64_t *ids = t->ids;
    Py_ssize_t k = t->k;
    int64_t *mids = t->mids, *offsets = t->offsets, *values = t->values, *lengths = t->lengths;
    int8_t *kinds = t->kinds;
    int32_t *seqs = t->seqs;
    int32_t n_stats = 0;
    int r;
    EventHead h = {0, 0, 0, 0};
    Stat st;
    for (Py_ssize_t j = 0; j < k; j++) {
        values[i * k + j] = lengths[i * k + j] = 0;
        kinds[i * k + j] = 0;
        seqs[i * k + j] = 0;
    }
    while ((r = next_stat(b, &pos, end, &h, &st)) > 0) {
        if (n_stats == INT32_MAX)
            return -1;
        n_stats++;
        for (Py_ssize_t j = 0; j < k; j++) {
            if (ids[j] != st.metadata_id)
                continue;
            Py_ssize_t at = i * k + j;
            kinds[at] = (int8_t)st.kind;
            seqs[at] = n_stats;
            lengths[at] = 0;
            if (st.kind == 4)
                values[at] = st.int_value;
            else if (st.kind == 3 || st.kind == 7 || st.kind == 2)
                values[at] = as_int64(st.uint_value);
            else if (st.kind == 5) {
                values[at] = st.str_start;
                lengths[at] = st.str_stop - st.str_start;
            } else
                values[at] = 0;
            break;
        }
    }
    if (r < 0)
        return -1;
    mids[i] = h.mid;
    offsets[i] = h.offset_set ? h.offset : 0;
    return 0;
}

static PyObject *decode_stats(PyObject *self, PyObject *args)
{
    Py_buffer data, bids, bm, bo, bv, bl, bk, bs;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*ny*w*w*w*w*w*w*", &data, &n, &bids, &bm, &bo, &bv, &bl, &bk, &bs))
        return NULL;
    PyObject *result = NULL;
    Py_buffer *cols[] = {&bids, &bm, &bo, &bv, &bl, &bk, &bs};
    Py_ssize_t k = bids.len / 8;
    if (bids.len % 8 || column(&bm, n, 8, "mids") || column(&bo, n, 8, "offsets")
        || column(&bv, n * k, 8, "values") || column(&bl, n * k, 8, "lengths") || column(&bk, n * k, 1, "kinds")
        || column(&bs, n * k, 4, "seqs")) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "stat ids must be int64");
        goto done;
    }
    StatsJob job = {bids.buf, k, bm.buf, bo.buf, bv.buf, bl.buf, bk.buf, bs.buf};
    result = run_on_events(&data, n, stats_job, &job);
done:
    PyBuffer_Release(&data);
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++)
        PyBuffer_Release(cols[c]);
    return result;
}

static PyObject *same_strings(PyObject *self, PyObject *args)
{
    Py_buffer data, bk, bs, bl, br;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*", &data, &bk, &bs, &bl, &br))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = bk.len;
    if (bs.len != n * 8 || bl.len != n * 8 || br.len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "columns of different lengths");
        goto done;
    }
    const uint8_t *b = (const uint8_t *)data.buf;
    const int8_t *kinds = bk.buf;
    const int64_t *starts = bs.buf, *lengths = bl.buf, *rep = br.buf;
    int same = 1;
    for (Py_ssize_t i = 0; i < n && same; i++) {
        if (kinds[i] != 1)
            continue;
        int64_t j = rep[i];
        if (j < 0 || j >= n || lengths[i] != lengths[j] || starts[i] < 0 || starts[j] < 0
            || lengths[i] < 0 || starts[i] > data.len - lengths[i] || starts[j] > data.len - lengths[j])
            same = 0;
        else
            same = memcmp(b + starts[i], b + starts[j], (size_t)lengths[i]) == 0;
    }
    result = PyBool_FromLong(same);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&bk);
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bl);
    PyBuffer_Release(&br);
    return result;
}

/* Self time and depth of one line's events, sorted by start, parents first: the stack walk of
 * tpudiag.model.intervals.nest_walk. Returns the number of partial overlaps, or -1 when an end
 * overflows int64 or a depth exceeds int16 (the caller then takes the Python path). */
static Py_ssize_t nest_in(const int64_t *start, const int64_t *dur, Py_ssize_t n, int64_t *self_ps,
                          int16_t *depth, int64_t *stack)
{
    Py_ssize_t top = 0, partial = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t s_i = start[i], e_i;
        if (__builtin_add_overflow(s_i, dur[i], &e_i))
            return -1;
        self_ps[i] = dur[i];
        while (top > 0 && s_i >= start[stack[top - 1]] + dur[stack[top - 1]])
            top--;
        depth[i] = 0;
        if (top > 0) {
            int64_t p = stack[top - 1], e_p = start[p] + dur[p];
            if (e_i > e_p)
                partial++;
            self_ps[p] -= (e_i < e_p ? e_i : e_p) - s_i;
            if (top > INT16_MAX)
                return -1;
            depth[i] = (int16_t)top;
        }
        stack[top++] = i;
    }
    return partial;
}

static PyObject *nest(PyObject *self, PyObject *args)
{
    Py_buffer bs, bd, bself, bdepth;
    if (!PyArg_ParseTuple(args, "y*y*w*w*", &bs, &bd, &bself, &bdepth))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = bs.len / 8;
    if (bs.len != n * 8 || bd.len != n * 8 || bself.len != n * 8 || bdepth.len != n * 2) {
        PyErr_SetString(PyExc_ValueError, "nest: columns of different lengths");
    } else {
        int64_t *stack = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        if (stack == NULL) {
            PyErr_NoMemory();
        } else {
            Py_ssize_t partial;
            Py_BEGIN_ALLOW_THREADS
            partial = nest_in(bs.buf, bd.buf, n, bself.buf, bdepth.buf, stack);
            Py_END_ALLOW_THREADS
            PyMem_Free(stack);
            result = PyLong_FromSsize_t(partial);
        }
    }
    PyBuffer_Release(&bs);
    PyBuffer_Release(&bd);
    PyBuffer_Release(&bself);
    PyBuffer_Release(&bdepth);
    return result;
}

/* tpudiag.analysis.collective_windows.nesting_facts in one walk of the events in (device, start,
 * depth) order (`order`, or the rows' own order when it has no entries): has_child[i] when the next
 * event of the walk is on i's device and deeper; in_coll[i] when i's parent, the last event of the
 * walk one level up (on any device, as the level passes find it) and on i's own device, is a
 * collective or inside one. Depths below 0 neither nest nor hold. -1 when an index of `order` or
 * a depth is out of range (the caller then takes the numpy passes). */
static int nesting_in(const int32_t *dev, const int16_t *depth, const uint8_t *is_coll, const int64_t *order,
                      Py_ssize_t n, uint8_t *has_child, uint8_t *in_coll, uint8_t *coll_or_inside, int64_t *last_at)
{
    for (int d = 0; d <= INT16_MAX; d++)
        last_at[d] = -1;
    int64_t prev = -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        int64_t i = order ? order[k] : (int64_t)k;
        if (i < 0 || i >= n)
            return -1;
        int d = depth[i];
        if (prev >= 0)
            has_child[prev] = dev[prev] == dev[i] && d > depth[prev];
        uint8_t inside = 0;
        if (d >= 1) {
            int64_t p = last_at[d - 1];
            inside = p >= 0 && dev[p] == dev[i] && coll_or_inside[p];
        }
        in_coll[i] = inside;
        coll_or_inside[i] = (uint8_t)(is_coll[i] != 0) | inside;
        if (d >= 0)
            last_at[d] = i;
        prev = i;
    }
    if (prev >= 0)
        has_child[prev] = 0;
    return 0;
}

static PyObject *nesting(PyObject *self, PyObject *args)
{
    Py_buffer bdev, bdepth, bcoll, border, bchild, binside;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*", &bdev, &bdepth, &bcoll, &border, &bchild, &binside))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = bdepth.len / 2;
    if (bdepth.len != n * 2 || bdev.len != n * 4 || bcoll.len != n || bchild.len != n || binside.len != n
        || (border.len != 0 && border.len != n * 8)) {
        PyErr_SetString(PyExc_ValueError, "nesting: columns of different lengths");
    } else {
        int64_t *last_at = PyMem_Malloc((size_t)(INT16_MAX + 1) * sizeof(int64_t));
        uint8_t *coll_or_inside = PyMem_Malloc((size_t)(n ? n : 1));
        if (last_at == NULL || coll_or_inside == NULL) {
            PyErr_NoMemory();
        } else {
            int r;
            Py_BEGIN_ALLOW_THREADS
            r = nesting_in(bdev.buf, bdepth.buf, bcoll.buf, border.len ? border.buf : NULL, n, bchild.buf, binside.buf,
                           coll_or_inside, last_at);
            Py_END_ALLOW_THREADS
            result = PyBool_FromLong(r == 0);
        }
        PyMem_Free(last_at);
        PyMem_Free(coll_or_inside);
    }
    PyBuffer_Release(&bdev);
    PyBuffer_Release(&bdepth);
    PyBuffer_Release(&bcoll);
    PyBuffer_Release(&border);
    PyBuffer_Release(&bchild);
    PyBuffer_Release(&binside);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_line", scan_line, METH_VARARGS,
     "scan_line(xline_bytes) -> (number of events, name, timestamp_ns), or None when its framing is not plain"},
    {"decode_events", decode_events, METH_VARARGS,
     "decode_events(xline_bytes, n, mids, starts, durs, kinds, hashes, key_starts, key_lengths, timed, off_id, "
     "dur_id, has_key, key_id, base_ps) -> True when every event was read into the writable columns (the four "
     "key columns unread and of any length without has_key)"},
    {"decode_stats", decode_stats, METH_VARARGS,
     "decode_stats(xline_bytes, n, stat_ids, mids, offsets, values, lengths, kinds, seqs) -> True when every "
     "event's metadata id, offset and the given stats were read into the writable columns"},
    {"same_strings", same_strings, METH_VARARGS,
     "same_strings(xline_bytes, kinds, key_starts, key_lengths, rep) -> whether each string key equals "
     "that of event rep[i]"},
    {"split_field", split_field, METH_VARARGS,
     "split_field(message_bytes, number) -> ([(start, stop) of each value of field number], the other fields' "
     "bytes), or None when the framing is not plain"},
    {"nest", nest, METH_VARARGS,
     "nest(starts, durs, self_ps, depth) -> partial overlaps, or -1 (int64 starts and durations, sorted by "
     "start, parents first; writes int64 self times and int16 depths)"},
    {"nesting", nesting, METH_VARARGS,
     "nesting(device_codes, depth, is_coll, order, has_child, in_coll) -> True when written (int32 device codes, "
     "int16 depths, bool flags, int64 order or empty for the rows' own; writes bool has_child and in_coll)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire", "XLine events from wire bytes", -1, methods};

PyMODINIT_FUNC PyInit__wire(void)
{
    PyObject *m = PyModule_Create(&module);
    /* decode_events leaves the key columns alone without a key (they may be empty): a module built
     * before says nothing, and is given full columns. */
    if (m != NULL && PyModule_AddIntConstant(m, "KEYLESS_COLUMNS", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
