/* picker.kvcache._native: KVBlockIndex.match's walk in C (picker/kvcache/index.py has the Python twin, which
 * defines the result; tests/kvcache/test_native.py checks both equal on random indexes).
 *
 * match(keys, holders_of, wanted, weight) -> dict[str, float]
 *   keys:       the request's block keys (ints), in order
 *   holders_of: request key -> holders: an int ``slot << 4 | mask`` (one holder) or a dict slot -> mask
 *   wanted:     slot -> endpoint key, the candidates the index knows
 *   weight:     16 floats, the weight of each mask
 * Per wanted slot, the sum of the weights of the leading keys it holds without a break, added in key order as
 * the Python twin adds them (so the floats are the same); slots holding nothing are absent.
 *
 * block_keys(data, block_bytes, parent, count) -> list[int]
 *   data:        a buffer of at least count * block_bytes bytes (the token ids' uint32 bytes)
 * token_keys(tokens, block_size, parent, count) -> list[int] | None
 *   tokens:      a list or tuple of at least count * block_size token ids, each hashed as a little-endian uint32
 *                (OverflowError outside [0, 2^32); None when one is not an int: the caller converts them)
 * Each key is XXH3-64 of one block's bytes seeded with the key before it (``parent`` for the first):
 * picker/kvcache/keys.py's chain, which defines the result with the ``xxhash`` package's xxh3_64. XXH3 is
 * written here from its specification (xxhash's doc/xxhash_spec.md); tests/kvcache/test_native.py checks it
 * against the package on every length up to 2 KiB, some longer, and four seeds each.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "../xxhash_spec.h"

#define SLOT_SHIFT 4
#define MASK 15

typedef struct {
    long slot;
    PyObject *slot_obj; /* the slot as a Python int (dict lookups) */
    PyObject *endpoint; /* borrowed from ``wanted`` */
    double total;
    int seen; /* its run started: in the result */
} run_t;

/* The run of a slot, or -1 when the slot is not wanted. */
static Py_ssize_t find(const Py_ssize_t *run_of, long nslots, long slot) {
    return slot >= 0 && slot < nslots ? run_of[slot] : -1;
}

static PyObject *match(PyObject *self, PyObject *args) {
    PyObject *keys, *holders_of, *wanted, *weight_list;
    if (!PyArg_ParseTuple(args, "OO!O!O!:match", &keys, &PyDict_Type, &holders_of, &PyDict_Type, &wanted,
                          &PyList_Type, &weight_list))
        return NULL;
    if (PyList_GET_SIZE(weight_list) != MASK + 1) {
        PyErr_SetString(PyExc_ValueError, "weight must have 16 entries");
        return NULL;
    }
    double weight[MASK + 1];
    for (int m = 0; m <= MASK; m++) {
        weight[m] = PyFloat_AsDouble(PyList_GET_ITEM(weight_list, m));
        if (weight[m] == -1.0 && PyErr_Occurred()) return NULL;
    }
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence");
    if (seq == NULL) return NULL;
    PyObject *result = PyDict_New();
    Py_ssize_t nwanted = PyDict_GET_SIZE(wanted);
    run_t *runs = PyMem_Calloc(nwanted > 0 ? (size_t)nwanted : 1, sizeof(run_t));
    Py_ssize_t *live = PyMem_Calloc(nwanted > 0 ? (size_t)nwanted : 1, sizeof(Py_ssize_t)); /* runs going on */
    Py_ssize_t *run_of = NULL;
    long nslots = 0;
    if (result == NULL || runs == NULL || live == NULL) goto fail;
    {
        Py_ssize_t pos = 0, n = 0;
        PyObject *slot_obj, *endpoint;
        while (PyDict_Next(wanted, &pos, &slot_obj, &endpoint)) {
            long slot = PyLong_AsLong(slot_obj);
            if (slot == -1 && PyErr_Occurred()) goto fail;
            if (slot < 0 || slot > (1L << 24)) {
                PyErr_SetString(PyExc_ValueError, "slots are small non-negative ints");
                goto fail;
            }
            if (slot >= nslots) nslots = slot + 1;
            runs[n].slot = slot;
            runs[n].slot_obj = slot_obj;
            runs[n].endpoint = endpoint;
            n++;
        }
        run_of = PyMem_Malloc((nslots > 0 ? (size_t)nslots : 1) * sizeof(Py_ssize_t));
        if (run_of == NULL) goto fail;
        for (long i = 0; i < nslots; i++) run_of[i] = -1;
        for (Py_ssize_t i = 0; i < nwanted; i++) run_of[runs[i].slot] = i;
    }
    Py_ssize_t nkeys = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t alive = 0;
    for (Py_ssize_t k = 0; k < nkeys; k++) {
        PyObject *holders = PyDict_GetItemWithError(holders_of, items[k]); /* borrowed */
        if (holders == NULL) {
            if (PyErr_Occurred()) goto fail;
            break;
        }
        int single = PyLong_CheckExact(holders);
        if (!single && !PyDict_Check(holders)) {
            PyErr_SetString(PyExc_TypeError, "holders must be an int or a dict");
            goto fail;
        }
        if (k == 0) { /* the runs that start: every wanted holder of the first key with a weight */
            Py_ssize_t pos = 0;
            PyObject *slot_obj = NULL, *mask_obj = NULL;
            long slot, mask;
            while (1) {
                if (single) {
                    if (pos++) break;
                    long h = PyLong_AsLong(holders);
                    if (h == -1 && PyErr_Occurred()) goto fail;
                    slot = h >> SLOT_SHIFT;
                    mask = h & MASK;
                } else {
                    if (!PyDict_Next(holders, &pos, &slot_obj, &mask_obj)) break;
                    slot = PyLong_AsLong(slot_obj);
                    mask = PyLong_AsLong(mask_obj);
                    if ((slot == -1 || mask == -1) && PyErr_Occurred()) goto fail;
                }
                Py_ssize_t i = find(run_of, nslots, slot);
                double w = weight[mask & MASK];
                if (i >= 0 && w > 0.0) {
                    runs[i].total = w;
                    runs[i].seen = 1;
                    live[alive++] = i;
                }
            }
            continue;
        }
        if (alive == 0) break;
        if (single) { /* one holder: every other run ends here */
            long h = PyLong_AsLong(holders);
            if (h == -1 && PyErr_Occurred()) goto fail;
            Py_ssize_t i = find(run_of, nslots, h >> SLOT_SHIFT), j = 0;
            double w = weight[h & MASK];
            while (j < alive && live[j] != i) j++;
            if (i < 0 || j == alive || w <= 0.0) break;
            runs[i].total += w;
            live[0] = i;
            alive = 1;
            continue;
        }
        Py_ssize_t kept = 0;
        for (Py_ssize_t j = 0; j < alive; j++) {
            run_t *run = &runs[live[j]];
            PyObject *mask_obj = PyDict_GetItemWithError(holders, run->slot_obj); /* borrowed */
            double w = 0.0;
            if (mask_obj != NULL) {
                long mask = PyLong_AsLong(mask_obj);
                if (mask == -1 && PyErr_Occurred()) goto fail;
                w = weight[mask & MASK];
            } else if (PyErr_Occurred()) {
                goto fail;
            }
            if (w > 0.0) { /* its run goes on; the others' end here */
                run->total += w;
                live[kept++] = live[j];
            }
        }
        alive = kept;
    }
    for (Py_ssize_t j = 0; j < nwanted; j++) {
        if (!runs[j].seen) continue;
        PyObject *total = PyFloat_FromDouble(runs[j].total);
        if (total == NULL || PyDict_SetItem(result, runs[j].endpoint, total) < 0) {
            Py_XDECREF(total);
            goto fail;
        }
        Py_DECREF(total);
    }
    PyMem_Free(runs);
    PyMem_Free(live);
    PyMem_Free(run_of);
    Py_DECREF(seq);
    return result;
fail:
    PyMem_Free(runs);
    PyMem_Free(live);
    PyMem_Free(run_of);
    Py_DECREF(seq);
    Py_XDECREF(result);
    return NULL;
}

/* ---- XXH3-64 with a seed (the specification's scalar algorithm) ---- */

static const uint8_t XXH3_SECRET[192] = {
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
};

#define PMX_1 0x165667919E3779F9ULL
#define PMX_2 0x9FB21C651E98DF25ULL

static inline uint64_t fold64(uint64_t a, uint64_t b) {
    unsigned __int128 p = (unsigned __int128)a * b;
    return (uint64_t)p ^ (uint64_t)(p >> 64);
}

static inline uint64_t avalanche(uint64_t h) {
    h ^= h >> 37;
    h *= PMX_1;
    return h ^ (h >> 32);
}

static inline uint64_t avalanche64(uint64_t h) { /* XXH64's */
    h ^= h >> 33;
    h *= PRIME64_2;
    h ^= h >> 29;
    h *= PRIME64_3;
    return h ^ (h >> 32);
}

static inline uint64_t rrmxmx(uint64_t h, uint64_t len) {
    h ^= rotl64(h, 49) ^ rotl64(h, 24);
    h *= PMX_2;
    h ^= (h >> 35) + len;
    h *= PMX_2;
    return h ^ (h >> 28);
}

static inline uint64_t mix16(const uint8_t *in, const uint8_t *sec, uint64_t seed) {
    return fold64(read64(in) ^ (read64(sec) + seed), read64(in + 8) ^ (read64(sec + 8) - seed));
}

static uint64_t len_0to16(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *sec = XXH3_SECRET;
    if (len > 8) {
        uint64_t lo = read64(in) ^ ((read64(sec + 24) ^ read64(sec + 32)) + seed);
        uint64_t hi = read64(in + len - 8) ^ ((read64(sec + 40) ^ read64(sec + 48)) - seed);
        return avalanche(len + __builtin_bswap64(lo) + hi + fold64(lo, hi));
    }
    if (len >= 4) {
        seed ^= (uint64_t)__builtin_bswap32((uint32_t)seed) << 32;
        uint64_t joined = read32(in + len - 4) + ((uint64_t)read32(in) << 32);
        return rrmxmx(joined ^ ((read64(sec + 8) ^ read64(sec + 16)) - seed), len);
    }
    if (len > 0) {
        uint32_t c1 = in[0], c2 = in[len >> 1], c3 = in[len - 1];
        uint32_t combined = (c1 << 16) | (c2 << 24) | c3 | ((uint32_t)len << 8);
        uint64_t flip = (uint64_t)(read32(sec) ^ read32(sec + 4)) + seed;
        return avalanche64((uint64_t)combined ^ flip);
    }
    return avalanche64(seed ^ (read64(sec + 56) ^ read64(sec + 64)));
}

static uint64_t len_17to128(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *sec = XXH3_SECRET;
    uint64_t acc = len * PRIME64_1;
    if (len > 32) {
        if (len > 64) {
            if (len > 96) {
                acc += mix16(in + 48, sec + 96, seed);
                acc += mix16(in + len - 64, sec + 112, seed);
            }
            acc += mix16(in + 32, sec + 64, seed);
            acc += mix16(in + len - 48, sec + 80, seed);
        }
        acc += mix16(in + 16, sec + 32, seed);
        acc += mix16(in + len - 32, sec + 48, seed);
    }
    acc += mix16(in, sec, seed);
    acc += mix16(in + len - 16, sec + 16, seed);
    return avalanche(acc);
}

static uint64_t len_129to240(const uint8_t *in, size_t len, uint64_t seed) {
    const uint8_t *sec = XXH3_SECRET;
    uint64_t acc = len * PRIME64_1;
    size_t rounds = len / 16;
    for (size_t i = 0; i < 8; i++) acc += mix16(in + 16 * i, sec + 16 * i, seed);
    uint64_t acc_end = mix16(in + len - 16, sec + 136 - 17, seed);
    acc = avalanche(acc);
    for (size_t i = 8; i < rounds; i++) acc_end += mix16(in + 16 * i, sec + 16 * (i - 8) + 3, seed);
    return avalanche(acc + acc_end);
}

static inline void accumulate_512(uint64_t *acc, const uint8_t *in, const uint8_t *sec) {
    for (int i = 0; i < 8; i++) {
        uint64_t v = read64(in + 8 * i);
        uint64_t k = v ^ read64(sec + 8 * i);
        acc[i ^ 1] += v;
        acc[i] += (uint64_t)(uint32_t)k * (k >> 32);
    }
}

static uint64_t hash_long(const uint8_t *in, size_t len, uint64_t seed) {
    uint8_t sec[192];
    for (int i = 0; i < 192 / 16; i++) {
        write64(sec + 16 * i, read64(XXH3_SECRET + 16 * i) + seed);
        write64(sec + 16 * i + 8, read64(XXH3_SECRET + 16 * i + 8) - seed);
    }
    uint64_t acc[8] = {PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1};
    const size_t stripes_per_block = (192 - 64) / 8, block_len = 64 * stripes_per_block;
    const size_t blocks = (len - 1) / block_len;
    for (size_t b = 0; b < blocks; b++) {
        for (size_t s = 0; s < stripes_per_block; s++) accumulate_512(acc, in + b * block_len + 64 * s, sec + 8 * s);
        for (int i = 0; i < 8; i++) { /* scramble */
            uint64_t a = acc[i];
            a ^= a >> 47;
            a ^= read64(sec + 192 - 64 + 8 * i);
            acc[i] = a * PRIME32_1;
        }
    }
    const size_t stripes = ((len - 1) - block_len * blocks) / 64;
    for (size_t s = 0; s < stripes; s++) accumulate_512(acc, in + blocks * block_len + 64 * s, sec + 8 * s);
    accumulate_512(acc, in + len - 64, sec + 192 - 64 - 7);
    uint64_t result = len * PRIME64_1;
    for (int i = 0; i < 4; i++) result += fold64(acc[2 * i] ^ read64(sec + 11 + 16 * i), acc[2 * i + 1] ^ read64(sec + 11 + 16 * i + 8));
    return avalanche(result);
}

static uint64_t xxh3_64(const uint8_t *in, size_t len, uint64_t seed) {
    if (len <= 16) return len_0to16(in, len, seed);
    if (len <= 128) return len_17to128(in, len, seed);
    if (len <= 240) return len_129to240(in, len, seed);
    return hash_long(in, len, seed);
}

/* The chain over ``count`` blocks of ``block_bytes`` at ``p``, as a new list of ints. */
static PyObject *chain(const uint8_t *p, Py_ssize_t block_bytes, uint64_t key, Py_ssize_t count) {
    PyObject *out = PyList_New(count);
    if (out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        key = xxh3_64(p + i * block_bytes, (size_t)block_bytes, key);
        PyObject *item = PyLong_FromUnsignedLongLong(key);
        if (item == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyObject *block_keys(PyObject *self, PyObject *args) {
    Py_buffer data;
    Py_ssize_t block_bytes, count;
    unsigned long long parent;
    if (!PyArg_ParseTuple(args, "y*nKn", &data, &block_bytes, &parent, &count)) return NULL;
    if (block_bytes < 1 || count < 0 || count > data.len / block_bytes) {
        PyBuffer_Release(&data);
        PyErr_SetString(PyExc_ValueError, "block_keys: count * block_bytes exceeds the data");
        return NULL;
    }
    PyObject *out = chain((const uint8_t *)data.buf, block_bytes, parent, count);
    PyBuffer_Release(&data);
    return out;
}

static PyObject *token_keys(PyObject *self, PyObject *args) {
    PyObject *tokens;
    Py_ssize_t block_size, count;
    unsigned long long parent;
    if (!PyArg_ParseTuple(args, "OnKn", &tokens, &block_size, &parent, &count)) return NULL;
    if (!PyList_Check(tokens) && !PyTuple_Check(tokens)) {
        PyErr_SetString(PyExc_TypeError, "token_keys: tokens must be a list or a tuple");
        return NULL;
    }
    Py_ssize_t have = PySequence_Fast_GET_SIZE(tokens);
    if (block_size < 1 || count < 0 || count > have / block_size) {
        PyErr_SetString(PyExc_ValueError, "token_keys: count * block_size exceeds the tokens");
        return NULL;
    }
    Py_ssize_t n = count * block_size;
    uint8_t *buf = PyMem_Malloc(n > 0 ? (size_t)n * 4 : 1);
    if (buf == NULL) return PyErr_NoMemory();
    PyObject **items = PySequence_Fast_ITEMS(tokens);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = items[i];
        if (!PyLong_Check(item)) {
            /* Not an int (numpy's, a float): None, and the caller converts. Calling its __index__ here could run
             * code that resizes the list under ``items``. */
            PyMem_Free(buf);
            Py_RETURN_NONE;
        }
        unsigned long v = PyLong_AsUnsignedLong(item);
        if (v == (unsigned long)-1 && PyErr_Occurred()) {
            PyMem_Free(buf);
            return NULL;
        }
        if (v > 0xFFFFFFFFUL) {
            PyMem_Free(buf);
            PyErr_SetString(PyExc_OverflowError, "token_keys: a token id above 2^32 - 1");
            return NULL;
        }
        write32(buf + 4 * i, (uint32_t)v);
    }
    PyObject *out = chain(buf, 4 * block_size, parent, count);
    PyMem_Free(buf);
    return out;
}

static PyMethodDef methods[] = {
    {"match", match, METH_VARARGS, "Endpoint -> tier-weighted longest prefix (KVBlockIndex.match's walk)."},
    {"block_keys", block_keys, METH_VARARGS, "The chained XXH3-64 keys of count blocks of a buffer."},
    {"token_keys", token_keys, METH_VARARGS, "The chained XXH3-64 keys of count blocks of token ids (keys.block_keys)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
