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
 *
 * XXH64 below is the scalar algorithm of the xxHash specification (Yann Collet, BSD-2-Clause),
 * doc/xxhash_spec.md, written out here so the build needs nothing but the compiler.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define P1 0x9E3779B185EBCA87ULL
#define P2 0xC2B2AE3D27D4EB4FULL
#define P3 0x165667B19E3779F9ULL
#define P4 0x85EBCA77C2B2AE63ULL
#define P5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t read64(const unsigned char *p) {
    /* little-endian regardless of the host */
    return (uint64_t)p[0] | ((uint64_t)p[1] << 8) | ((uint64_t)p[2] << 16) | ((uint64_t)p[3] << 24) |
           ((uint64_t)p[4] << 32) | ((uint64_t)p[5] << 40) | ((uint64_t)p[6] << 48) | ((uint64_t)p[7] << 56);
}

static inline uint32_t read32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t xround(uint64_t acc, uint64_t input) {
    acc += input * P2;
    acc = rotl64(acc, 31);
    return acc * P1;
}

static inline uint64_t merge(uint64_t acc, uint64_t val) {
    acc ^= xround(0, val);
    return acc * P1 + P4;
}

static uint64_t xxh64(const unsigned char *p, size_t len, uint64_t seed) {
    const unsigned char *end = p + len;
    uint64_t h;
    if (len >= 32) {
        const unsigned char *limit = end - 32;
        uint64_t v1 = seed + P1 + P2, v2 = seed + P2, v3 = seed, v4 = seed - P1;
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
        h = seed + P5;
    }
    h += (uint64_t)len;
    while (p + 8 <= end) {
        h ^= xround(0, read64(p));
        h = rotl64(h, 27) * P1 + P4;
        p += 8;
    }
    if (p + 4 <= end) {
        h ^= (uint64_t)read32(p) * P1;
        h = rotl64(h, 23) * P2 + P3;
        p += 4;
    }
    while (p < end) {
        h ^= (uint64_t)(*p) * P5;
        h = rotl64(h, 11) * P1;
        p++;
    }
    h ^= h >> 33;
    h *= P2;
    h ^= h >> 29;
    h *= P3;
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

static PyMethodDef methods[] = {
    {"prefix_hashes", prefix_hashes, METH_VARARGS, "The chained xxh64 block hashes of a prompt."},
    {"match", match, METH_VARARGS, "Blocks per endpoint key along a prefix walk."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", "picker's native hot path.", -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
