/* picker.scheduling._native: the prefix index's per-request loops at C speed.
 *
 * Optional: setup.py builds it when a C compiler and Python's headers are there; otherwise
 * picker/scheduling/plugins/prefix_index.py uses its pure-Python twins, which define the results
 * (tests/scheduling/test_native.py checks both equal on randomized inputs).
 *
 *   prefix_hashes(text, block_bytes, max_blocks, model, salt="") -> tuple[int, ...]
 *       h0 = xxh64(utf8(model) || utf8(salt)), hi = xxh64(block_i || le64(h(i-1))), seed 0; the text's UTF-8
 *       bytes cut into blocks of block_bytes (the last may be partial), at most max_blocks; () when shorter
 *       than one block.
 *   match(holders, hashes) -> dict[str, int]
 *       walks ``hashes`` until one that ``holders`` (hash -> str | set[str]) lacks, counting blocks per key.
 *   tokens_of(...), select(...), LoadTable: the large-pool pre-filter's pass (picker/scheduling/prefilter.py),
 *       below.
 *   PrefixIndex: the whole approximate prefix index (learning, eviction, the match walk), below.
 *
 * XXH64 below is the scalar algorithm of the xxHash specification (Yann Collet, BSD-2-Clause),
 * doc/xxhash_spec.md, written out here so the build needs nothing but the compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#include "../xxhash_spec.h"

static inline uint64_t xround(uint64_t acc, uint64_t input) {
    acc += input * PRIME64_2;
    acc = rotl64(acc, 31);
    return acc * PRIME64_1;
}

static inline uint64_t merge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * PRIME64_1 + PRIME64_4;
}

static uint64_t xxh64(const unsigned char *p, size_t len, uint64_t seed) {
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = seed + PRIME64_1 + PRIME64_2, v2 = seed + PRIME64_2, v3 = seed, v4 = seed - PRIME64_1;
        do {
            v1 = xround(v1, read64(p));
            v2 = xround(v2, read64(p + 8));
            v3 = xround(v3, read64(p + 16));
            v4 = xround(v4, read64(p + 24));
            p += 32;
        } while (p <= limit);
        h = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        h = merge(h, v1);
        h = merge(h, v2);
        h = merge(h, v3);
        h = merge(h, v4);
    } else {
        h = seed + PRIME64_5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xround(0, read64(p));
        h = rotl64(h, 27) * PRIME64_1 + PRIME64_4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * PRIME64_1;
        h = rotl64(h, 23) * PRIME64_2 + PRIME64_3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * PRIME64_5;
        h = rotl64(h, 11) * PRIME64_1;
        p++;
    }
    h ^= h >> 33;
    h *= PRIME64_2;
    h ^= h >> 29;
    h *= PRIME64_3;
    h ^= h >> 32;
    return h;
}

static PyObject *prefix_hashes(PyObject *self, PyObject *args) {
    PyObject *text, *model, *salt = NULL;
    Py_ssize_t block_bytes, max_blocks;
    if (!PyArg_ParseTuple(args, "UnnU|U:prefix_hashes", &text, &block_bytes, &max_blocks, &model, &salt)) {
        return NULL;
    }
    Py_ssize_t n;
    const char *data = PyUnicode_AsUTF8AndSize(text, &n); /* cached by the str; no copy for ASCII */
    if (data == NULL) return NULL;
    if (n < block_bytes || block_bytes <= 0 || max_blocks <= 0) return PyTuple_New(0);
    if (n / block_bytes >= max_blocks) n = block_bytes * max_blocks; /* no overflow: n >= block_bytes here */

    Py_ssize_t model_n, salt_n = 0;
    const char *model_s = PyUnicode_AsUTF8AndSize(model, &model_n);
    if (model_s == NULL) return NULL;
    const char *salt_s = "";
    if (salt != NULL && (salt_s = PyUnicode_AsUTF8AndSize(salt, &salt_n)) == NULL) return NULL;

    size_t seed_n = (size_t)model_n + (size_t)salt_n;
    size_t buf_n = (size_t)block_bytes + 8;
    unsigned char *buf = PyMem_Malloc(buf_n > seed_n ? buf_n : (seed_n ? seed_n : 1));
    if (buf == NULL) return PyErr_NoMemory();
    memcpy(buf, model_s, (size_t)model_n);
    memcpy(buf + model_n, salt_s, (size_t)salt_n);
    uint64_t prev = xxh64(buf, seed_n, 0);

    Py_ssize_t count = (n + block_bytes - 1) / block_bytes;
    PyObject *out = PyTuple_New(count);
    if (out == NULL) {
        PyMem_Free(buf);
        return NULL;
    }
    const unsigned char *src = (const unsigned char *)data;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t start = i * block_bytes;
        size_t len = (size_t)((n - start) < block_bytes ? (n - start) : block_bytes);
        memcpy(buf, src + start, len);
        for (int b = 0; b < 8; b++) buf[len + b] = (unsigned char)(prev >> (8 * b));
        prev = xxh64(buf, len + 8, 0);
        PyObject *value = PyLong_FromUnsignedLongLong(prev);
        if (value == NULL) {
            PyMem_Free(buf);
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, value);
    }
    PyMem_Free(buf);
    return out;
}

static int bump(PyObject *counts, PyObject *key) {
    PyObject *old = PyDict_GetItemWithError(counts, key); /* borrowed */
    if (old == NULL && PyErr_Occurred()) return -1;
    long value = old == NULL ? 1 : PyLong_AsLong(old) + 1;
    if (value == 0 && PyErr_Occurred()) return -1;
    PyObject *now = PyLong_FromLong(value);
    if (now == NULL) return -1;
    int rc = PyDict_SetItem(counts, key, now);
    Py_DECREF(now);
    return rc;
}

static PyObject *match(PyObject *self, PyObject *args) {
    PyObject *holders_of, *hashes;
    if (!PyArg_ParseTuple(args, "O!O:match", &PyDict_Type, &holders_of, &hashes)) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *counts = PyDict_New();
    if (counts == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *holders = PyDict_GetItemWithError(holders_of, items[i]); /* borrowed */
        if (holders == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        if (PyUnicode_CheckExact(holders)) {
            if (bump(counts, holders) < 0) goto fail;
            continue;
        }
        PyObject *it = PyObject_GetIter(holders);
        if (it == NULL) goto fail;
        PyObject *key;
        while ((key = PyIter_Next(it)) != NULL) {
            int rc = bump(counts, key);
            Py_DECREF(key);
            if (rc < 0) {
                Py_DECREF(it);
                goto fail;
            }
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) goto fail;
    }
    Py_DECREF(seq);
    return counts;
fail:
    Py_DECREF(seq);
    Py_DECREF(counts);
    return NULL;
}

/* tokens_of(endpoints, loads, now, request_tokens, decode_tokens, max_age_s, mode=0) -> list[float] | None
 * picker.endpoints.serverload.tokens_of (mode 1: requests_of; 2: waiting_of; 3: foreign_of) with ``load`` = loads.get (a dict key ->
 * EndpointLoad; absent: zero), the same double arithmetic in the same order. None when a value is not the int/float
 * it should be, or the counts are too large for that arithmetic to be exact (then the caller runs the Python loop). */

/* Attribute reads of the slotted dataclasses (Endpoint, EndpointMetrics, EndpointLoad) without the generic
 * lookup: per attribute name, the exact type last seen and its slot's offset (the type is kept alive while
 * cached). Any other type, or an attribute that is not a plain slot, goes through PyObject_GetAttr. */
typedef struct {
    PyObject *name;
    PyTypeObject *type;
    Py_ssize_t offset;
} slot_t;

static slot_t a_key, a_metrics, a_updated_at, a_waiting, a_running, a_own_requests, a_requests, a_tokens;

static PyObject *attr(PyObject *obj, slot_t *slot) {
    PyTypeObject *type = Py_TYPE(obj);
    if (slot->type != type) {
        PyObject *d = _PyType_Lookup(type, slot->name); /* borrowed */
        if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type) ||
            ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            return PyObject_GetAttr(obj, slot->name);
        }
        Py_XDECREF(slot->type);
        Py_INCREF(type);
        slot->type = type;
        slot->offset = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    PyObject *v = *(PyObject **)((char *)obj + slot->offset);
    if (v == NULL) return PyObject_GetAttr(obj, slot->name); /* unset: the AttributeError */
    Py_INCREF(v);
    return v;
}

static int get_ll(PyObject *obj, slot_t *name, long long *out) {
    PyObject *v = attr(obj, name);
    if (v == NULL) return -1;
    if (!PyLong_CheckExact(v)) {
        Py_DECREF(v);
        return 1;
    }
    int overflow = 0;
    *out = PyLong_AsLongLongAndOverflow(v, &overflow);
    Py_DECREF(v);
    if (*out == -1 && PyErr_Occurred()) return -1;
    return overflow || *out > (1LL << 52) || *out < -(1LL << 52) ? 1 : 0; /* exact as a double */
}

/* foreign * waiting / reported as Python computes it (an exact int product, then one correctly rounded division):
 * 0 and *w; 1 when the product is not exact in a double (counts beyond ~2^26, which only a broken page reports). */
static inline int waiting_share(long long foreign, long long waiting, long long reported, double *w) {
    long long product;
    if (__builtin_mul_overflow(foreign, waiting, &product) || product > (1LL << 53) || product < -(1LL << 53)) {
        return 1;
    }
    *w = (double)product / (double)reported;
    return 0;
}

/* serverload.MAX_OTHERS_PER_OWN */
#define MAX_OTHERS_PER_OWN 8.0

/* serverload._moved: the foreign requests now and the waiting ones among them ((0, 0) for none), the report beyond
 * picker's own at the sample moved m - 1 times picker's own change since; 1 when the waiting share is not exact in
 * a double (see waiting_share). */
static inline int moved(long long reported, long long waiting, long long own_then, long long own_now, double *f,
                        double *w) {
    long long foreign = reported - own_then;
    *f = *w = 0.0;
    if (foreign <= 0) return 0;
    double share;
    if (waiting_share(foreign, waiting, reported, &share)) return 1;
    if (own_then <= 0 || own_now == own_then) {
        *f = (double)foreign;
        *w = share;
        return 0;
    }
    double ratio = (double)reported / (double)own_then;
    double change = ((ratio < MAX_OTHERS_PER_OWN ? ratio : MAX_OTHERS_PER_OWN) - 1.0) * (double)(own_now - own_then);
    if (change >= 0.0) {
        *f = (double)foreign + change;
        *w = share + change;
        return 0;
    }
    double left = (double)foreign + change;
    if (left <= 0.0) return 0;
    *f = left;
    *w = share * left / (double)foreign;
    return 0;
}

static PyObject *tokens_of(PyObject *self, PyObject *args) {
    PyObject *endpoints, *loads;
    double now, rt, dt, max_age;
    int mode = 0; /* 0 tokens, 1 requests, 2 the foreign waiting requests, 3 the foreign requests */
    if (!PyArg_ParseTuple(args, "OO!dddd|i:tokens_of", &endpoints, &PyDict_Type, &loads, &now, &rt, &dt, &max_age,
                          &mode)) {
        return NULL;
    }
    if (mode < 0 || mode > 3) {
        PyErr_SetString(PyExc_ValueError, "mode must be 0 (tokens), 1 (requests), 2 (waiting) or 3 (foreign)");
        return NULL;
    }
    int requests = mode == 1, waiting_only = mode == 2, foreign_only = mode == 3;
    PyObject *seq = PySequence_Fast(endpoints, "endpoints must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = items[i];
        long long own_requests = 0, own_tokens = 0, waiting, running, own_then;
        int rc;
        PyObject *key = attr(e, &a_key);
        if (key == NULL) goto fail;
        PyObject *own = PyDict_GetItemWithError(loads, key); /* borrowed */
        Py_DECREF(key);
        if (own == NULL && PyErr_Occurred()) goto fail;
        if (own != NULL) {
            if ((rc = get_ll(own, &a_requests, &own_requests)) != 0) goto rc_fail;
            if ((rc = get_ll(own, &a_tokens, &own_tokens)) != 0) goto rc_fail;
        }
        PyObject *m = attr(e, &a_metrics);
        if (m == NULL) goto fail;
        PyObject *updated_obj = attr(m, &a_updated_at);
        if (updated_obj == NULL || !PyFloat_CheckExact(updated_obj)) {
            Py_XDECREF(updated_obj);
            Py_DECREF(m);
            rc = updated_obj == NULL ? -1 : 1;
            goto rc_fail;
        }
        double updated = PyFloat_AS_DOUBLE(updated_obj);
        Py_DECREF(updated_obj);
        double value;
        if (updated <= 0.0 || now - updated > max_age) {
            value = waiting_only || foreign_only ? 0.0
                    : requests   ? (double)own_requests + 0.0
                                 : (double)own_tokens + 0.0 * rt + 0.0 * dt;
        } else {
            rc = get_ll(m, &a_waiting, &waiting);
            if (rc == 0) rc = get_ll(m, &a_running, &running);
            if (rc != 0) {
                Py_DECREF(m);
                goto rc_fail;
            }
            PyObject *then = attr(m, &a_own_requests);
            if (then == NULL) {
                Py_DECREF(m);
                goto fail;
            }
            if (then == Py_None) {
                own_then = own_requests;
            } else {
                rc = get_ll(m, &a_own_requests, &own_then);
                if (rc != 0) {
                    Py_DECREF(then);
                    Py_DECREF(m);
                    goto rc_fail;
                }
            }
            Py_DECREF(then);
            double f, w; /* waiting_of is not moved (serverload.waiting_of) */
            if (moved(waiting + running, waiting, own_then, waiting_only ? own_then : own_requests, &f, &w)) {
                Py_DECREF(m);
                rc = 1;
                goto rc_fail;
            }
            if (f <= 0.0) {
                value = waiting_only || foreign_only ? 0.0
                        : requests   ? (double)own_requests + 0.0
                                     : (double)own_tokens + 0.0 * rt + 0.0 * dt;
            } else {
                value = waiting_only ? w
                        : foreign_only ? w + (f - w)
                        : requests   ? (double)own_requests + (w + (f - w))
                                     : (double)own_tokens + w * rt + (f - w) * dt;
            }
        }
        Py_DECREF(m);
        PyObject *f = PyFloat_FromDouble(value);
        if (f == NULL) goto fail;
        PyList_SET_ITEM(out, i, f);
        continue;
    rc_fail:
        if (rc < 0) goto fail;
        Py_DECREF(out);
        Py_DECREF(seq);
        Py_RETURN_NONE;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_XDECREF(out);
    Py_DECREF(seq);
    return NULL;
}

/* select(endpoints, loads, k, held) -> list: the endpoints whose load is among the k smallest (ties: the
 * earlier; as sorted(range(n), key=loads.__getitem__)[:k]) or whose key is in ``held``, in their order. */
/* The value that would be at index ``want`` of ``a`` sorted ascending (Hoare's quickselect; reorders ``a``). */
static double nth(double *a, Py_ssize_t n, Py_ssize_t want) {
    Py_ssize_t lo = 0, hi = n - 1;
    while (lo < hi) {
        double pivot = a[lo + (hi - lo) / 2];
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (a[i] < pivot) i++;
            while (a[j] > pivot) j--;
            if (i <= j) {
                double t = a[i];
                a[i] = a[j];
                a[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j) {
            hi = j;
        } else if (want >= i) {
            lo = i;
        } else {
            return a[want];
        }
    }
    return a[want];
}

static PyObject *select_(PyObject *self, PyObject *args) {
    PyObject *endpoints, *loads_obj, *held;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OO!nO:select", &endpoints, &PyList_Type, &loads_obj, &k, &held)) return NULL;
    PyObject *seq = PySequence_Fast(endpoints, "endpoints must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (PyList_GET_SIZE(loads_obj) != n) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "one load per endpoint");
        return NULL;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    double *loads = PyMem_Malloc(sizeof(double) * (size_t)(n ? 2 * n : 1));
    if (loads == NULL) {
        Py_DECREF(seq);
        return PyErr_NoMemory();
    }
    double *sorted = loads + n;
    for (Py_ssize_t i = 0; i < n; i++) {
        double v = PyFloat_AsDouble(PyList_GET_ITEM(loads_obj, i));
        if (v == -1.0 && PyErr_Occurred()) goto fail;
        if (v != v) { /* NaN: sorted() order is not defined by value; leave it to Python */
            PyMem_Free(loads);
            Py_DECREF(seq);
            Py_RETURN_NONE;
        }
        loads[i] = sorted[i] = v;
    }
    /* the k-th smallest value; those below it are kept, and of those equal to it the first few */
    Py_ssize_t below = 0, at_quota = 0;
    double kth = 0.0;
    if (k > 0 && n > 0) {
        kth = nth(sorted, n, (k < n ? k : n) - 1);
        for (Py_ssize_t i = 0; i < n; i++) below += loads[i] < kth;
        at_quota = (k < n ? k : n) - below;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) goto fail;
    int use_held = held != Py_None && PyObject_Size(held) > 0;
    if (PyErr_Occurred()) goto fail_out;
    for (Py_ssize_t i = 0; i < n; i++) {
        int keep = 0;
        if (k > 0 && loads[i] < kth) {
            keep = 1;
        } else if (k > 0 && loads[i] == kth && at_quota > 0) {
            keep = 1;
            at_quota--;
        } else if (use_held) {
            PyObject *key = attr(items[i], &a_key);
            if (key == NULL) goto fail_out;
            keep = PySequence_Contains(held, key);
            Py_DECREF(key);
            if (keep < 0) goto fail_out;
        }
        if (keep && PyList_Append(out, items[i]) < 0) goto fail_out;
    }
    PyMem_Free(loads);
    Py_DECREF(seq);
    return out;
fail_out:
    Py_DECREF(out);
fail:
    PyMem_Free(loads);
    Py_DECREF(seq);
    return NULL;
}

/* LoadTable: the pre-filter's whole pass (tokens_of, then select) for a candidate tuple seen before.
 *
 * The candidates of most requests are the very same tuple (the snapshot's cached candidates, new only when a
 * scrape, a pod or an exclusion changes the pool), so what the servers reported is read into arrays once per
 * tuple; a request then reads those arrays and its own ledger (the keys with picker's or its peers' requests in
 * flight, usually far fewer than the pool) instead of four Python objects per endpoint. The results are
 * tokens_of's numbers and select's choice exactly (the same double arithmetic): for an endpoint without a ledger
 * entry the reported part is computed ahead with own = 0 (moved from its count at the sample to none); an endpoint
 * with one is computed as tokens_of does.
 *
 * select(endpoints, loads, now, request_tokens, decode_tokens, max_age_s, k, held) -> list | None
 *   None (the caller takes the per-object path): ``endpoints`` is not a tuple, or is neither the tuple the
 *   table describes nor the one of the call before (a tuple seen once is only remembered: building for a tuple
 *   that never comes back would cost more than the pass), or holds a value tokens_of would decline, or a duplicate key; ``held`` not a set or dict;
 *   a ledger value that is not an exact int; a NaN load; counts whose product is not exact in a double.
 * The table keeps a reference to the tuple it describes: its identity cannot be reused while held, and the
 * endpoints in it are frozen (immutable) dataclasses. */

typedef struct {
    PyObject_HEAD
    PyObject *seen;  /* the tuple of the last call (strong) */
    PyObject *built; /* the tuple the arrays describe (strong), or NULL */
    PyObject *declined; /* the last tuple the arrays could not describe (strong), or NULL: not built again */
    PyObject *index; /* key -> position in built */
    Py_ssize_t n;
    double *updated; /* metrics.updated_at */
    long long *waiting, *running, *then; /* then: metrics.own_requests; has_then[i] = 0 when None */
    unsigned char *has_then;
    double *w, *rest; /* with no ledger entry: the foreign waiting requests, the rest of the foreign (moved) */
    unsigned char *foreign; /* with no ledger entry: whether there are foreign requests */
    double *value, *scratch; /* per call */
    unsigned char *mark;     /* per call: held */
} LoadTableObject;

static void LoadTable_clear_arrays(LoadTableObject *t) {
    PyMem_Free(t->updated);
    t->updated = t->w = t->rest = t->value = t->scratch = NULL;
    t->waiting = t->running = t->then = NULL;
    t->has_then = t->foreign = t->mark = NULL;
    Py_CLEAR(t->built);
    Py_CLEAR(t->index);
    t->n = 0;
}

static void LoadTable_dealloc(LoadTableObject *t) {
    LoadTable_clear_arrays(t);
    Py_CLEAR(t->seen);
    Py_CLEAR(t->declined);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

/* tokens_of's value for one endpoint: the arrays' reported numbers and this call's own numbers. */
static inline double load_value(const LoadTableObject *t, Py_ssize_t i, long long own_requests, long long own_tokens,
                                double now, double rt, double dt, double max_age) {
    double updated = t->updated[i];
    if (updated <= 0.0 || now - updated > max_age) return (double)own_tokens + 0.0 * rt + 0.0 * dt;
    long long waiting = t->waiting[i], reported = waiting + t->running[i];
    double f, w;
    if (moved(reported, waiting, t->has_then[i] ? t->then[i] : own_requests, own_requests, &f, &w)) {
        return Py_NAN; /* the caller declines NaN loads */
    }
    if (f <= 0.0) return (double)own_tokens + 0.0 * rt + 0.0 * dt;
    return (double)own_tokens + w * rt + (f - w) * dt;
}

/* 1: built; 0: declined (the tuple holds what the arrays cannot; nothing built); -1: error. */
static int LoadTable_build(LoadTableObject *t, PyObject *tuple) {
    LoadTable_clear_arrays(t);
    Py_ssize_t n = PyTuple_GET_SIZE(tuple), m = n ? n : 1;
    /* one block: 5 doubles and 3 long longs per endpoint, then 3 bytes */
    char *block = PyMem_Malloc((size_t)m * (5 * sizeof(double) + 3 * sizeof(long long) + 3));
    if (block == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->updated = (double *)block;
    t->w = t->updated + m;
    t->rest = t->w + m;
    t->value = t->rest + m;
    t->scratch = t->value + m;
    t->waiting = (long long *)(t->scratch + m);
    t->running = t->waiting + m;
    t->then = t->running + m;
    t->has_then = (unsigned char *)(t->then + m);
    t->foreign = t->has_then + m;
    t->mark = t->foreign + m;
    PyObject *index = PyDict_New();
    if (index == NULL) goto fail;
    t->index = index;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PyTuple_GET_ITEM(tuple, i);
        int rc;
        PyObject *key = attr(e, &a_key);
        if (key == NULL) goto fail;
        PyObject *pos = PyLong_FromSsize_t(i);
        if (pos == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        rc = PyDict_SetDefault(index, key, pos) == pos ? 0 : 1; /* 1: a duplicate key */
        Py_DECREF(pos);
        Py_DECREF(key);
        if (PyErr_Occurred()) goto fail;
        if (rc) goto declined;
        PyObject *mo = attr(e, &a_metrics);
        if (mo == NULL) goto fail;
        PyObject *updated = attr(mo, &a_updated_at);
        if (updated == NULL || !PyFloat_CheckExact(updated)) {
            Py_XDECREF(updated);
            Py_DECREF(mo);
            if (PyErr_Occurred()) goto fail;
            goto declined;
        }
        t->updated[i] = PyFloat_AS_DOUBLE(updated);
        Py_DECREF(updated);
        rc = get_ll(mo, &a_waiting, &t->waiting[i]);
        if (rc == 0) rc = get_ll(mo, &a_running, &t->running[i]);
        PyObject *then = rc == 0 ? attr(mo, &a_own_requests) : NULL;
        if (rc == 0 && then == NULL) rc = -1;
        if (rc == 0) {
            t->has_then[i] = then != Py_None;
            t->then[i] = 0;
            if (then != Py_None) rc = get_ll(mo, &a_own_requests, &t->then[i]);
        }
        Py_XDECREF(then);
        Py_DECREF(mo);
        if (rc < 0) goto fail;
        if (rc > 0) goto declined;
        long long waiting = t->waiting[i], reported = waiting + t->running[i];
        double f; /* without a ledger entry picker has none there now: own 0 */
        if (moved(reported, waiting, t->has_then[i] ? t->then[i] : 0, 0, &f, &t->w[i])) goto declined;
        t->foreign[i] = f > 0.0;
        if (f > 0.0) t->rest[i] = f - t->w[i];
    }
    Py_INCREF(tuple);
    t->built = tuple;
    t->n = n;
    return 1;
declined:
    LoadTable_clear_arrays(t);
    return 0;
fail:
    LoadTable_clear_arrays(t);
    return -1;
}

static PyObject *LoadTable_select(LoadTableObject *t, PyObject *args) {
    PyObject *endpoints, *loads, *held;
    double now, rt, dt, max_age;
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "OO!ddddnO:select", &endpoints, &PyDict_Type, &loads, &now, &rt, &dt, &max_age, &k,
                          &held)) {
        return NULL;
    }
    if (!PyTuple_CheckExact(endpoints)) Py_RETURN_NONE;
    if (held != Py_None && !PyAnySet_CheckExact(held) && !PyDict_CheckExact(held)) Py_RETURN_NONE;
    if (endpoints != t->built) {
        if (endpoints == t->declined) Py_RETURN_NONE;
        if (endpoints != t->seen) {
            /* remembered, built if it comes on the next call; the built tuple stays, so requests with a subset
             * hint (a new tuple each) between the pool's own do not cost it a rebuild */
            Py_INCREF(endpoints);
            Py_XSETREF(t->seen, endpoints);
            Py_RETURN_NONE;
        }
        int rc = LoadTable_build(t, endpoints);
        if (rc <= 0) {
            if (rc < 0) return NULL;
            Py_INCREF(endpoints);
            Py_XSETREF(t->declined, endpoints);
            Py_RETURN_NONE;
        }
    }
    Py_ssize_t n = t->n;
    double zero = 0.0 + 0.0 * rt + 0.0 * dt;
    for (Py_ssize_t i = 0; i < n; i++) {
        double updated = t->updated[i];
        t->value[i] = updated <= 0.0 || now - updated > max_age || !t->foreign[i] ? zero
                                                                                 : 0.0 + t->w[i] * rt + t->rest[i] * dt;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *own;
    while (PyDict_Next(loads, &pos, &key, &own)) {
        PyObject *at = PyDict_GetItemWithError(t->index, key); /* borrowed */
        if (at == NULL) {
            if (PyErr_Occurred()) return NULL;
            continue; /* not a candidate */
        }
        Py_ssize_t i = PyLong_AsSsize_t(at);
        long long own_requests, own_tokens;
        int rc = get_ll(own, &a_requests, &own_requests);
        if (rc == 0) rc = get_ll(own, &a_tokens, &own_tokens);
        if (rc < 0) return NULL;
        if (rc > 0) Py_RETURN_NONE;
        t->value[i] = load_value(t, i, own_requests, own_tokens, now, rt, dt, max_age);
    }
    Py_ssize_t below = 0, at_quota = 0, want = k < n ? k : n;
    double kth = 0.0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (t->value[i] != t->value[i]) Py_RETURN_NONE; /* NaN: as select */
        t->scratch[i] = t->value[i];
    }
    if (want > 0) {
        kth = nth(t->scratch, n, want - 1);
        for (Py_ssize_t i = 0; i < n; i++) below += t->value[i] < kth;
        at_quota = want - below;
    }
    memset(t->mark, 0, (size_t)n);
    if (held != Py_None) {
        PyObject *it = PyObject_GetIter(held);
        if (it == NULL) return NULL;
        PyObject *hk;
        while ((hk = PyIter_Next(it)) != NULL) {
            PyObject *at = PyDict_GetItemWithError(t->index, hk);
            Py_DECREF(hk);
            if (at != NULL) t->mark[PyLong_AsSsize_t(at)] = 1;
            else if (PyErr_Occurred()) break;
        }
        Py_DECREF(it);
        if (PyErr_Occurred()) return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        int keep = t->mark[i];
        if (want > 0 && t->value[i] < kth) {
            keep = 1;
        } else if (want > 0 && t->value[i] == kth && at_quota > 0) {
            keep = 1;
            at_quota--;
        }
        if (keep && PyList_Append(out, PyTuple_GET_ITEM(endpoints, i)) < 0) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

static PyMethodDef LoadTable_methods[] = {
    {"select", (PyCFunction)LoadTable_select, METH_VARARGS,
     "select(tokens_of(endpoints, loads, now, request_tokens, decode_tokens, max_age_s), k, held) for a candidate "
     "tuple seen on the call before; None to take that path instead."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LoadTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "picker.scheduling._native.LoadTable",
    .tp_basicsize = sizeof(LoadTableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The pre-filter's pass over a candidate tuple, its reported loads read once per tuple.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)LoadTable_dealloc,
    .tp_methods = LoadTable_methods,
};

/* PrefixIndex: picker/scheduling/plugins/prefix_index.py's PyPrefixIndex, the same operations and results, with
 * no Python object per block. A node is one (block hash, endpoint) pair: it sits in its endpoint's LRU list
 * (oldest to newest) and in the chain of its hash bucket; nodes and endpoints live in arrays addressed by
 * int32 index (free lists through ``chain`` and ``oldest``), so growing an array moves nothing that is pointed
 * to. Buckets double when the nodes outnumber them. Learning a fresh 62-block prompt was ~50-120 µs in Python
 * (dict and OrderedDict inserts, evictions, a PyLong per hash); here it is a few µs. */

typedef struct {
    uint64_t hash;
    int32_t ep;     /* owning endpoint */
    int32_t older;  /* LRU neighbours within the endpoint, -1 at the ends */
    int32_t newer;
    int32_t chain;  /* next node in the same bucket (or the next free node) */
} pnode_t;

typedef struct {
    PyObject *key;  /* NULL: a free slot */
    int32_t oldest; /* LRU ends, -1 when empty (a free slot: the next free endpoint) */
    int32_t newest;
    Py_ssize_t count;
    uint64_t seq;   /* creation order: ``retain`` reports in it, as the Python dict's order */
} pep_t;

typedef struct {
    PyObject_HEAD
    Py_ssize_t capacity;
    pnode_t *nodes;
    int32_t nodes_cap, nodes_used, free_node;
    int32_t *buckets;
    uint32_t mask;
    Py_ssize_t live, distinct;
    pep_t *eps;
    int32_t eps_cap, eps_used, free_ep;
    PyObject *ids; /* key -> endpoint index */
    uint64_t next_seq;
} PrefixIndexObject;

static inline uint32_t bucket_of(const PrefixIndexObject *ix, uint64_t h) {
    return (uint32_t)((h ^ (h >> 32)) & ix->mask);
}

static int ix_grow_buckets(PrefixIndexObject *ix) {
    uint32_t n = (ix->mask + 1) * 2;
    int32_t *b = PyMem_Malloc(sizeof(int32_t) * n);
    if (b == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint32_t i = 0; i < n; i++) b[i] = -1;
    PyMem_Free(ix->buckets);
    ix->buckets = b;
    ix->mask = n - 1;
    for (int32_t e = 0; e < ix->eps_used; e++) {
        if (ix->eps[e].key == NULL) continue;
        for (int32_t i = ix->eps[e].oldest; i >= 0; i = ix->nodes[i].newer) {
            uint32_t k = bucket_of(ix, ix->nodes[i].hash);
            ix->nodes[i].chain = b[k];
            b[k] = i;
        }
    }
    return 0;
}

static int32_t ix_find(const PrefixIndexObject *ix, uint64_t h, int32_t ep) {
    for (int32_t i = ix->buckets[bucket_of(ix, h)]; i >= 0; i = ix->nodes[i].chain) {
        if (ix->nodes[i].hash == h && ix->nodes[i].ep == ep) return i;
    }
    return -1;
}

static int ix_held(const PrefixIndexObject *ix, uint64_t h, int32_t except) {
    for (int32_t i = ix->buckets[bucket_of(ix, h)]; i >= 0; i = ix->nodes[i].chain) {
        if (i != except && ix->nodes[i].hash == h) return 1;
    }
    return 0;
}

static void ix_lru_unlink(PrefixIndexObject *ix, int32_t i) {
    pnode_t *n = &ix->nodes[i];
    pep_t *e = &ix->eps[n->ep];
    if (n->older >= 0) ix->nodes[n->older].newer = n->newer; else e->oldest = n->newer;
    if (n->newer >= 0) ix->nodes[n->newer].older = n->older; else e->newest = n->older;
}

static void ix_lru_append(PrefixIndexObject *ix, int32_t i) {
    pnode_t *n = &ix->nodes[i];
    pep_t *e = &ix->eps[n->ep];
    n->older = e->newest;
    n->newer = -1;
    if (e->newest >= 0) ix->nodes[e->newest].newer = i; else e->oldest = i;
    e->newest = i;
}

static void ix_remove(PrefixIndexObject *ix, int32_t i) {
    pnode_t *n = &ix->nodes[i];
    if (!ix_held(ix, n->hash, i)) ix->distinct--;
    int32_t *link = &ix->buckets[bucket_of(ix, n->hash)];
    while (*link != i) link = &ix->nodes[*link].chain;
    *link = n->chain;
    ix_lru_unlink(ix, i);
    ix->eps[n->ep].count--;
    n->chain = ix->free_node;
    ix->free_node = i;
    ix->live--;
}

/* Make room for one more element in a PyMem array of ``*cap`` elements of ``size`` bytes (``first`` when empty):
 * 0, or -1 with MemoryError set. Indexes into the array stay valid; pointers into it do not. */
static int ix_grow(void **array, int32_t *cap, size_t size, int32_t first) {
    if (*cap >= INT32_MAX / 2) {
        PyErr_SetString(PyExc_OverflowError, "prefix index full");
        return -1;
    }
    int32_t want = *cap ? *cap * 2 : first;
    void *grown = PyMem_Realloc(*array, size * (size_t)want);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    *array = grown;
    *cap = want;
    return 0;
}

/* A new node for (h, ep), newest in ep's LRU; -1 with an exception set when out of memory. */
static int32_t ix_insert(PrefixIndexObject *ix, uint64_t h, int32_t ep) {
    int32_t i = ix->free_node;
    if (i >= 0) {
        ix->free_node = ix->nodes[i].chain;
    } else {
        if (ix->nodes_used == ix->nodes_cap && ix_grow((void **)&ix->nodes, &ix->nodes_cap, sizeof(pnode_t), 1024) < 0)
            return -1;
        i = ix->nodes_used++;
    }
    if (!ix_held(ix, h, -1)) ix->distinct++;
    pnode_t *n = &ix->nodes[i];
    n->hash = h;
    n->ep = ep;
    uint32_t k = bucket_of(ix, h);
    n->chain = ix->buckets[k];
    ix->buckets[k] = i;
    ix_lru_append(ix, i);
    ix->eps[ep].count++;
    ix->live++;
    if ((uint64_t)ix->live > (uint64_t)ix->mask + 1 && ix_grow_buckets(ix) < 0) return -1;
    return i;
}

/* The endpoint index of ``key``: -1 when absent (and not ``create``), -2 with an exception set. */
static int32_t ix_endpoint(PrefixIndexObject *ix, PyObject *key, int create) {
    PyObject *found = PyDict_GetItemWithError(ix->ids, key); /* borrowed */
    if (found != NULL) return (int32_t)PyLong_AsLong(found);
    if (PyErr_Occurred()) return -2;
    if (!create) return -1;
    int32_t e = ix->free_ep;
    if (e >= 0) {
        ix->free_ep = ix->eps[e].oldest;
    } else {
        if (ix->eps_used == ix->eps_cap && ix_grow((void **)&ix->eps, &ix->eps_cap, sizeof(pep_t), 16) < 0) return -2;
        e = ix->eps_used++;
    }
    PyObject *id = PyLong_FromLong(e);
    if (id == NULL || PyDict_SetItem(ix->ids, key, id) < 0) {
        Py_XDECREF(id);
        ix->eps[e].key = NULL;
        ix->eps[e].oldest = ix->free_ep;
        ix->free_ep = e;
        return -2;
    }
    Py_DECREF(id);
    Py_INCREF(key);
    ix->eps[e] = (pep_t){key, -1, -1, 0, ix->next_seq++};
    return e;
}

static int ix_hash(PyObject *obj, uint64_t *out) {
    if (!PyLong_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "block hashes must be ints");
        return -1;
    }
    unsigned long long v = PyLong_AsUnsignedLongLong(obj);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int PrefixIndex_init(PrefixIndexObject *ix, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"capacity_per_endpoint", NULL};
    Py_ssize_t capacity;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "n:PrefixIndex", kwlist, &capacity)) return -1;
    if (ix->ids != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PrefixIndex is initialised once");
        return -1;
    }
    ix->capacity = capacity;
    ix->free_node = ix->free_ep = -1;
    ix->mask = 1023;
    ix->buckets = PyMem_Malloc(sizeof(int32_t) * 1024);
    ix->ids = PyDict_New();
    if (ix->buckets == NULL || ix->ids == NULL) {
        if (ix->ids == NULL) return -1;
        PyErr_NoMemory();
        return -1;
    }
    for (int i = 0; i < 1024; i++) ix->buckets[i] = -1;
    return 0;
}

static void PrefixIndex_dealloc(PrefixIndexObject *ix) {
    for (int32_t e = 0; e < ix->eps_used; e++) Py_XDECREF(ix->eps[e].key);
    PyMem_Free(ix->eps);
    PyMem_Free(ix->nodes);
    PyMem_Free(ix->buckets);
    Py_XDECREF(ix->ids);
    Py_TYPE(ix)->tp_free((PyObject *)ix);
}

static int ix_ready(PrefixIndexObject *ix) {
    if (ix->ids == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "PrefixIndex.__init__ was not called");
        return -1;
    }
    return 0;
}

/* add(key, hashes, capacity=None) -> int: learn hashes (last first) as held by key; evict beyond the bound. */
static PyObject *PrefixIndex_add(PrefixIndexObject *ix, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"key", "hashes", "capacity", NULL};
    PyObject *key, *hashes, *capacity = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "UO|O:add", kwlist, &key, &hashes, &capacity)) return NULL;
    if (ix_ready(ix) < 0) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n == 0) {
        Py_DECREF(seq);
        return PyLong_FromLong(0);
    }
    Py_ssize_t limit = ix->capacity;
    if (capacity != Py_None) {
        Py_ssize_t given = PyNumber_AsSsize_t(capacity, PyExc_OverflowError);
        if (given == -1 && PyErr_Occurred()) goto fail;
        if (given > 0) limit = given;
    }
    int32_t ep = ix_endpoint(ix, key, 1);
    if (ep < 0) goto fail;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long added = 0;
    for (Py_ssize_t j = n - 1; j >= 0; j--) {
        uint64_t h;
        if (ix_hash(items[j], &h) < 0) goto fail;
        int32_t i = ix_find(ix, h, ep);
        if (i >= 0) {
            ix_lru_unlink(ix, i);
            ix_lru_append(ix, i);
        } else {
            if (ix_insert(ix, h, ep) < 0) goto fail;
            added++;
        }
    }
    while (ix->eps[ep].count > limit) ix_remove(ix, ix->eps[ep].oldest);
    Py_DECREF(seq);
    return PyLong_FromLong(added);
fail:
    Py_DECREF(seq);
    return NULL;
}

/* match(hashes) -> dict[str, int]: blocks per endpoint along the walk, until a hash nobody holds. */
static PyObject *PrefixIndex_match(PrefixIndexObject *ix, PyObject *hashes) {
    if (ix_ready(ix) < 0) return NULL;
    PyObject *seq = PySequence_Fast(hashes, "hashes must be a sequence");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    long *counts = PyMem_Calloc((size_t)(ix->eps_used ? ix->eps_used : 1), sizeof(long));
    int32_t *order = PyMem_Malloc(sizeof(int32_t) * (size_t)(ix->eps_used ? ix->eps_used : 1));
    PyObject *out = NULL;
    int32_t seen = 0;
    if (counts == NULL || order == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t j = 0; j < n; j++) {
        uint64_t h;
        if (ix_hash(items[j], &h) < 0) goto done;
        int any = 0;
        for (int32_t i = ix->buckets[bucket_of(ix, h)]; i >= 0; i = ix->nodes[i].chain) {
            if (ix->nodes[i].hash != h) continue;
            int32_t e = ix->nodes[i].ep;
            if (counts[e]++ == 0) order[seen++] = e;
            any = 1;
        }
        if (!any) break;
    }
    out = PyDict_New();
    if (out == NULL) goto done;
    for (int32_t s = 0; s < seen; s++) {
        PyObject *v = PyLong_FromLong(counts[order[s]]);
        if (v == NULL || PyDict_SetItem(out, ix->eps[order[s]].key, v) < 0) {
            Py_XDECREF(v);
            Py_CLEAR(out);
            goto done;
        }
        Py_DECREF(v);
    }
done:
    PyMem_Free(counts);
    PyMem_Free(order);
    Py_DECREF(seq);
    return out;
}

static int seq_order(const void *a, const void *b, void *eps) {
    uint64_t x = ((pep_t *)eps)[*(const int32_t *)a].seq, y = ((pep_t *)eps)[*(const int32_t *)b].seq;
    return (x > y) - (x < y);
}

/* retain(keys) -> list[str]: forget every endpoint not in keys; the forgotten keys, oldest first. */
static PyObject *PrefixIndex_retain(PrefixIndexObject *ix, PyObject *keys) {
    if (ix_ready(ix) < 0) return NULL;
    PyObject *keep = PySet_New(keys);
    if (keep == NULL) return NULL;
    PyObject *gone = PyList_New(0);
    int32_t *drop = PyMem_Malloc(sizeof(int32_t) * (size_t)(ix->eps_used ? ix->eps_used : 1));
    int32_t ndrop = 0;
    if (gone == NULL || drop == NULL) {
        if (drop == NULL) PyErr_NoMemory();
        goto fail;
    }
    for (int32_t e = 0; e < ix->eps_used; e++) {
        if (ix->eps[e].key == NULL) continue;
        int rc = PySet_Contains(keep, ix->eps[e].key);
        if (rc < 0) goto fail;
        if (!rc) drop[ndrop++] = e;
    }
    /* insertion sort by creation order (a handful of endpoints) */
    for (int32_t a = 1; a < ndrop; a++) {
        int32_t v = drop[a], b = a;
        while (b > 0 && seq_order(&drop[b - 1], &v, ix->eps) > 0) {
            drop[b] = drop[b - 1];
            b--;
        }
        drop[b] = v;
    }
    for (int32_t d = 0; d < ndrop; d++) {
        int32_t e = drop[d];
        PyObject *key = ix->eps[e].key;
        if (PyList_Append(gone, key) < 0 || PyDict_DelItem(ix->ids, key) < 0) goto fail;
        while (ix->eps[e].oldest >= 0) ix_remove(ix, ix->eps[e].oldest);
        ix->eps[e].key = NULL;
        Py_DECREF(key);
        ix->eps[e].oldest = ix->free_ep;
        ix->free_ep = e;
    }
    PyMem_Free(drop);
    Py_DECREF(keep);
    return gone;
fail:
    PyMem_Free(drop);
    Py_XDECREF(gone);
    Py_DECREF(keep);
    return NULL;
}

static PyObject *PrefixIndex_endpoint_blocks(PrefixIndexObject *ix, PyObject *key) {
    if (ix_ready(ix) < 0) return NULL;
    int32_t e = ix_endpoint(ix, key, 0);
    if (e == -2) return NULL;
    return PyLong_FromSsize_t(e < 0 ? 0 : ix->eps[e].count);
}

static PyObject *PrefixIndex_size(PrefixIndexObject *ix, void *closure) {
    (void)closure;
    return PyLong_FromSsize_t(ix->distinct);
}

static PyMethodDef PrefixIndex_methods[] = {
    {"add", (PyCFunction)(void (*)(void))PrefixIndex_add, METH_VARARGS | METH_KEYWORDS,
     "Record that endpoint key holds hashes (learned last first); evict its least recently used beyond "
     "capacity. Returns how many it did not hold before."},
    {"match", (PyCFunction)PrefixIndex_match, METH_O, "Endpoint key -> blocks it holds along the walk."},
    {"retain", (PyCFunction)PrefixIndex_retain, METH_O, "Forget every endpoint not in keys; the forgotten keys."},
    {"endpoint_blocks", (PyCFunction)PrefixIndex_endpoint_blocks, METH_O, "Blocks the index holds for key."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef PrefixIndex_getset[] = {
    {"size", (getter)PrefixIndex_size, NULL, "Distinct block hashes held by any endpoint.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PrefixIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "picker.scheduling._native.PrefixIndex",
    .tp_basicsize = sizeof(PrefixIndexObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "hash -> endpoints holding it, with a per-endpoint LRU bound (prefix_index.PyPrefixIndex in C).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)PrefixIndex_init,
    .tp_dealloc = (destructor)PrefixIndex_dealloc,
    .tp_methods = PrefixIndex_methods,
    .tp_getset = PrefixIndex_getset,
};

static PyMethodDef methods[] = {
    {"tokens_of", tokens_of, METH_VARARGS, "Estimated in-flight tokens per endpoint (serverload.tokens_of)."},
    {"select", select_, METH_VARARGS, "The k least loaded endpoints and the prefix holders, in order."},
    {"prefix_hashes", prefix_hashes, METH_VARARGS, "The chained xxh64 block hashes of a prompt."},
    {"match", match, METH_VARARGS, "Blocks per endpoint key along a prefix walk."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "picker's native hot path.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) {
    slot_t *slots[] = {&a_key, &a_metrics, &a_updated_at, &a_waiting, &a_running, &a_own_requests, &a_requests,
                       &a_tokens};
    const char *names[] = {"key", "metrics", "updated_at", "waiting", "running", "own_requests", "requests", "tokens"};
    for (size_t i = 0; i < sizeof(slots) / sizeof(slots[0]); i++) {
        if ((slots[i]->name = PyUnicode_InternFromString(names[i])) == NULL) return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    /* readies each type and adds it under the last part of its tp_name */
    if (PyModule_AddType(m, &PrefixIndexType) < 0 || PyModule_AddType(m, &LoadTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
