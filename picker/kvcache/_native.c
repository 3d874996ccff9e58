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
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

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

static PyMethodDef methods[] = {
    {"match", match, METH_VARARGS, "Endpoint -> tier-weighted longest prefix (KVBlockIndex.match's walk)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__native(void) { return PyModule_Create(&module); }
