/* The @trace wrapper of a plain function, in C: the same steps as the compiled Python
 * body in chiptrace/recording/wrappers.py (its docstring), without a Python frame.
 *
 * Why C: a decorated call's own work is a context read, an id, a Live tuple, a context set
 * and reset, two clock reads and one row appended; in Python the frame and the bytecode
 * around them cost as much as the work (0.55-0.67 us a call on the 2-core CI machine,
 * against ~0.2 here). The Python body stays the reference and the fallback: this module
 * is optional at install time, and wrappers.py uses it only when it imported and the
 * OpenTelemetry context is the usual ContextVar.
 *
 * State: the wrappers' globals dict (spans.WRAPPER_GLOBALS) is read into the statics
 * below by refresh(), which chiptrace.recording.spans calls after every change of it
 * (the enabled flag, the recorder, the remote parent, the id counter after a fork).
 * Everything runs under the GIL, as the Python body does: a free-threaded build does not
 * compile this module (and chiptrace refuses to start there).
 *
 * Never raises into the program where the Python body would not: the bookkeeping after
 * the call (context reset, recording the row) swallows its own errors, and the
 * function's exception reaches the caller untouched.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "chiptrace's C wrapper relies on the GIL; the Python wrapper is used instead"
#endif

static PyObject *G;          /* the globals dict */
static PyObject *VAR;        /* OpenTelemetry's context ContextVar */
static int ON, OFF;
static PyObject *REC, *REMOTE, *HI, *NEW_ID, *LIVE, *PARENT_IDS, *EXTRA, *END_LIVE,
    *FAIL_LIVE, *RECORD_FIRST, *START, *KEY, *ZERO;
static PyObject *S_CUR, *S_CHUNK_ROWS, *S_ROLL;
static Py_ssize_t CHUNK_ROWS; /* the recorder's, read when it changes */

typedef struct {
    PyObject_HEAD
    PyObject *fn;
    PyObject *site;
    PyObject *dict;
    PyObject *weaklist;
    vectorcallfunc vectorcall;
} Wrapper;

static PyObject *
now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* time.time_ns(): the clock of every other span */
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec);
}

/* A Live (a tuple subclass) of four items, stolen. */
static PyObject *
make_live(PyObject *th, PyObject *tl, PyObject *sid, PyObject *start)
{
    PyTypeObject *tp = (PyTypeObject *)LIVE;
    PyObject *live = tp->tp_alloc(tp, 4);
    if (live == NULL)
        return NULL;
    Py_INCREF(th);
    Py_INCREF(tl);
    Py_INCREF(sid);
    Py_INCREF(start);
    PyTuple_SET_ITEM(live, 0, th);
    PyTuple_SET_ITEM(live, 1, tl);
    PyTuple_SET_ITEM(live, 2, sid);
    PyTuple_SET_ITEM(live, 3, start);
    return live;
}

/* After the call: the row to the recorder (or to end_live / record_first). Errors are
 * cleared: recording never raises into the traced program. */
static void
finish(Wrapper *self, PyObject *th, PyObject *tl, PyObject *sid, PyObject *pid,
       PyObject *start, PyObject *end)
{
    PyObject *r = NULL;
    int extra = 0;
    if (EXTRA != NULL && PyDict_GET_SIZE(EXTRA)) {
        extra = PyDict_Contains(EXTRA, sid);
        if (extra < 0) {
            PyErr_Clear();
            extra = 0;
        }
    }
    if (extra) {
        r = PyObject_CallFunctionObjArgs(END_LIVE, th, tl, sid, self->site, pid, start, end,
                                         NULL);
    }
    else {
        PyObject *row = PyTuple_Pack(7, self->site, th, tl, sid, pid, start, end);
        if (row == NULL) {
            PyErr_Clear();
            return;
        }
        /* Ints only: it can never be part of a cycle, so the collector need not see it
         * (a buffer of a million rows would otherwise be walked by each collection). */
        PyObject_GC_UnTrack(row);
        if (REC == Py_None) {
            r = PyObject_CallOneArg(RECORD_FIRST, row);
        }
        else {
            PyObject *cur = PyObject_GetAttr(REC, S_CUR);
            if (cur != NULL && PyList_CheckExact(cur)) {
                if (PyList_Append(cur, row) == 0) {
                    if (PyList_GET_SIZE(cur) >= CHUNK_ROWS)
                        r = PyObject_CallMethodNoArgs(REC, S_ROLL);
                    else
                        r = Py_NewRef(Py_None);
                }
            }
            Py_XDECREF(cur);
        }
        Py_DECREF(row);
    }
    if (r == NULL)
        PyErr_Clear();
    Py_XDECREF(r);
}

static PyObject *
wrapper_vectorcall(Wrapper *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (!ON) {
        if (OFF)
            return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
        /* not started yet: start() starts the recorder before the span's clock is read */
        PyObject *started = PyObject_CallNoArgs(START);
        if (started == NULL)
            return NULL;
        int yes = PyObject_IsTrue(started);
        Py_DECREF(started);
        if (yes < 0)
            return NULL;
        if (!yes)
            return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    PyObject *ctx = NULL;
    if (PyContextVar_Get(VAR, NULL, &ctx) < 0 || ctx == NULL || !PyDict_Check(ctx)) {
        PyErr_Clear();
        Py_XDECREF(ctx);
        return PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
    }
    PyObject *parent = PyDict_GetItemWithError(ctx, KEY); /* borrowed */
    if (parent == NULL && PyErr_Occurred())
        PyErr_Clear();
    Py_XINCREF(parent);
    PyObject *sid = PyObject_CallNoArgs(NEW_ID);
    PyObject *th = NULL, *tl = NULL, *pid = NULL, *start = NULL, *live = NULL;
    PyObject *token = NULL, *result = NULL;
    if (sid == NULL)
        goto bail;
    if (parent != NULL && Py_TYPE(parent) == (PyTypeObject *)LIVE) {
        th = Py_NewRef(PyTuple_GET_ITEM(parent, 0));
        tl = Py_NewRef(PyTuple_GET_ITEM(parent, 1));
        pid = Py_NewRef(PyTuple_GET_ITEM(parent, 2));
    }
    else if (parent == NULL && REMOTE == Py_None) {
        th = Py_NewRef(HI);
        tl = Py_NewRef(sid);
        pid = Py_NewRef(ZERO);
    }
    else {
        PyObject *ids = PyObject_CallFunctionObjArgs(PARENT_IDS, parent ? parent : Py_None,
                                                    sid, NULL);
        if (ids == NULL || !PyTuple_Check(ids) || PyTuple_GET_SIZE(ids) != 3) {
            Py_XDECREF(ids);
            goto bail;
        }
        th = Py_NewRef(PyTuple_GET_ITEM(ids, 0));
        tl = Py_NewRef(PyTuple_GET_ITEM(ids, 1));
        pid = Py_NewRef(PyTuple_GET_ITEM(ids, 2));
        Py_DECREF(ids);
    }
    start = now();
    if (start == NULL)
        goto bail;
    live = make_live(th, tl, sid, start);
    if (live == NULL)
        goto bail;
    /* A context holding nothing but the parent span (the usual case) is replaced whole. */
    PyObject *inner;
    if (PyDict_GET_SIZE(ctx) == (parent != NULL))
        inner = PyDict_New();
    else
        inner = PyDict_Copy(ctx);
    if (inner == NULL)
        goto bail;
    if (PyDict_SetItem(inner, KEY, live) < 0) {
        Py_DECREF(inner);
        goto bail;
    }
    token = PyContextVar_Set(VAR, inner);
    Py_DECREF(inner);
    if (token == NULL)
        goto bail;

    result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);

    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (et != NULL) {
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL && ev != NULL)
            PyException_SetTraceback(ev, tb);
        PyObject *r = PyObject_CallFunctionObjArgs(FAIL_LIVE, th, tl, sid,
                                                   ev ? ev : Py_None, NULL);
        if (r == NULL)
            PyErr_Clear();
        Py_XDECREF(r);
    }
    PyObject *end = now();
    if (PyContextVar_Reset(VAR, token) < 0)
        PyErr_Clear(); /* the function changed the context it was called in */
    if (end != NULL)
        finish(self, th, tl, sid, pid, start, end);
    else
        PyErr_Clear();
    Py_XDECREF(end);
    PyErr_Restore(et, ev, tb);
    goto done;

bail:
    /* chiptrace's own failure before the call: the call runs untraced, never fails */
    PyErr_Clear();
    result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
done:
    Py_XDECREF(token);
    Py_XDECREF(live);
    Py_XDECREF(start);
    Py_XDECREF(pid);
    Py_XDECREF(tl);
    Py_XDECREF(th);
    Py_XDECREF(sid);
    Py_XDECREF(parent);
    Py_DECREF(ctx);
    return result;
}

/* ---------------------------------------------------------------- the type */

static PyObject *
wrapper_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *fn, *site;
    if (!PyArg_ParseTuple(args, "OO!:Wrapper", &fn, &PyLong_Type, &site))
        return NULL;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "Wrapper: fn must be callable");
        return NULL;
    }
    Wrapper *self = (Wrapper *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->fn = Py_NewRef(fn);
    self->site = Py_NewRef(site);
    self->vectorcall = (vectorcallfunc)wrapper_vectorcall;
    return (PyObject *)self;
}

static int
wrapper_traverse(Wrapper *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->dict);
    return 0;
}

static int
wrapper_clear(Wrapper *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->dict);
    return 0;
}

static void
wrapper_dealloc(Wrapper *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weaklist != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    wrapper_clear(self);
    Py_CLEAR(self->site);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* As a function is: bound to an instance when read through one (a decorated method). */
static PyObject *
wrapper_descr_get(PyObject *self, PyObject *obj, PyObject *type)
{
    if (obj == NULL || obj == Py_None)
        return Py_NewRef(self);
    return PyMethod_New(self, obj);
}

/* What functools.wraps did not copy (__code__, __defaults__, __globals__...) reads
 * through to the wrapped function, so code that inspects a decorated function sees it. */
static PyObject *
wrapper_getattro(PyObject *self, PyObject *name)
{
    PyObject *got = PyObject_GenericGetAttr(self, name);
    if (got != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return got;
    PyErr_Clear();
    return PyObject_GetAttr(((Wrapper *)self)->fn, name);
}

static PyObject *
wrapper_repr(Wrapper *self)
{
    PyObject *q = self->dict ? PyDict_GetItemString(self->dict, "__qualname__") : NULL;
    if (q != NULL)
        return PyUnicode_FromFormat("<function %U at %p>", q, self);
    return PyUnicode_FromFormat("<function %R at %p>", self->fn, self);
}

/* Pickled by reference, as a module-level function is (its qualified name). */
static PyObject *
wrapper_reduce(Wrapper *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttrString((PyObject *)self, "__qualname__");
}

static PyObject *
wrapper_get_wrapped_fn(Wrapper *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->fn);
}

static PyObject *
wrapper_get_site(Wrapper *self, void *Py_UNUSED(closure))
{
    return Py_NewRef(self->site);
}

static PyMethodDef wrapper_methods[] = {
    {"__reduce__", (PyCFunction)wrapper_reduce, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef wrapper_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"_chiptrace_fn", (getter)wrapper_get_wrapped_fn, NULL, "the function called", NULL},
    {"_chiptrace_site", (getter)wrapper_get_site, NULL, "the site its spans are", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject WrapperType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chiptrace.recording._cwrap.Wrapper",
    .tp_doc = "A function decorated with @chiptrace.trace (see chiptrace.recording.wrappers).",
    .tp_basicsize = sizeof(Wrapper),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_new = wrapper_new,
    .tp_dealloc = (destructor)wrapper_dealloc,
    .tp_traverse = (traverseproc)wrapper_traverse,
    .tp_clear = (inquiry)wrapper_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Wrapper, vectorcall),
    .tp_descr_get = wrapper_descr_get,
    .tp_getattro = wrapper_getattro,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_repr = (reprfunc)wrapper_repr,
    .tp_dictoffset = offsetof(Wrapper, dict),
    .tp_weaklistoffset = offsetof(Wrapper, weaklist),
    .tp_methods = wrapper_methods,
    .tp_getset = wrapper_getset,
};

/* ---------------------------------------------------------------- module functions */

static int
load(PyObject **slot, const char *name)
{
    PyObject *v = PyDict_GetItemString(G, name); /* borrowed */
    if (v == NULL) {
        PyErr_Format(PyExc_KeyError, "chiptrace wrappers' globals lack %s", name);
        return -1;
    }
    Py_INCREF(v);
    Py_XSETREF(*slot, v);
    return 0;
}

static PyObject *
refresh(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    if (G == NULL)
        Py_RETURN_NONE;
    PyObject *on = NULL, *off = NULL;
    if (load(&on, "ON") < 0 || load(&off, "OFF") < 0 || load(&REC, "REC") < 0 ||
        load(&REMOTE, "REMOTE") < 0 || load(&HI, "HI") < 0 || load(&NEW_ID, "new_id") < 0 ||
        load(&LIVE, "Live") < 0 || load(&PARENT_IDS, "parent_ids") < 0 ||
        load(&EXTRA, "EXTRA") < 0 || load(&END_LIVE, "end_live") < 0 ||
        load(&FAIL_LIVE, "fail_live") < 0 || load(&RECORD_FIRST, "record_first") < 0 ||
        load(&START, "start") < 0 || load(&KEY, "KEY") < 0) {
        Py_XDECREF(on);
        Py_XDECREF(off);
        return NULL;
    }
    if (!PyType_Check(LIVE) || !PyType_IsSubtype((PyTypeObject *)LIVE, &PyTuple_Type) ||
        !PyDict_Check(EXTRA)) {
        Py_DECREF(on);
        Py_DECREF(off);
        PyErr_SetString(PyExc_TypeError, "chiptrace wrappers' globals: Live or EXTRA");
        return NULL;
    }
    int is_on = PyObject_IsTrue(on), is_off = PyObject_IsTrue(off);
    Py_DECREF(on);
    Py_DECREF(off);
    if (is_on < 0 || is_off < 0)
        return NULL;
    ON = is_on;
    OFF = is_off;
    CHUNK_ROWS = PY_SSIZE_T_MAX;
    if (REC != Py_None) {
        PyObject *limit = PyObject_GetAttr(REC, S_CHUNK_ROWS);
        Py_ssize_t n = limit ? PyLong_AsSsize_t(limit) : -1;
        Py_XDECREF(limit);
        if (n < 0)
            return NULL;
        CHUNK_ROWS = n;
    }
    Py_RETURN_NONE;
}

static PyObject *
bind(PyObject *module, PyObject *args)
{
    PyObject *g, *var;
    if (!PyArg_ParseTuple(args, "O!O!:bind", &PyDict_Type, &g, &PyContextVar_Type, &var))
        return NULL;
    Py_XSETREF(G, Py_NewRef(g));
    Py_XSETREF(VAR, Py_NewRef(var));
    return refresh(module, NULL);
}

static PyMethodDef module_methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(globals, context_var): the state the wrappers read, and refresh() it."},
    {"refresh", refresh, METH_NOARGS, "Read the wrappers' globals again (after a change)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_cwrap", "The @trace wrapper in C (see _cwrap.c).", -1,
    module_methods,
};

PyMODINIT_FUNC
PyInit__cwrap(void)
{
    if (PyType_Ready(&WrapperType) < 0)
        return NULL;
    S_CUR = PyUnicode_InternFromString("cur");
    S_CHUNK_ROWS = PyUnicode_InternFromString("chunk_rows");
    S_ROLL = PyUnicode_InternFromString("roll");
    ZERO = PyLong_FromLong(0);
    if (S_CUR == NULL || S_CHUNK_ROWS == NULL || S_ROLL == NULL || ZERO == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL)
        return NULL;
    Py_INCREF(&WrapperType);
    if (PyModule_AddObject(m, "Wrapper", (PyObject *)&WrapperType) < 0) {
        Py_DECREF(&WrapperType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
