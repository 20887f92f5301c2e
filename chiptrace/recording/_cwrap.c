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
#include <structmember.h>
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
#define MAX_DEPTH 4000        /* nested traced calls a thread may make (see the call) */
static _Thread_local int depth;

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

/* An error of Python code chiptrace called: cleared when it is an Exception (chiptrace's
 * own failure never reaches the program), kept when it is not: a KeyboardInterrupt or a
 * SystemExit that a signal handler raised while that code ran is the program's, and the
 * Python body would raise it too. Returns -1 when one is kept. */
static int
swallow(void)
{
    if (PyErr_Occurred() == NULL || PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        return 0;
    }
    return -1;
}

/* A kept error raised while (*et, *ev, *tb) was on its way out replaces it, with it as
 * its __context__, as an exception raised in a `finally` block does. */
static void
supersede(PyObject **et, PyObject **ev, PyObject **tb)
{
    PyObject *t, *v, *b;
    PyErr_Fetch(&t, &v, &b);
    PyErr_NormalizeException(&t, &v, &b);
    if (b != NULL && v != NULL)
        PyException_SetTraceback(v, b);
    if (v != NULL && *ev != NULL)
        PyException_SetContext(v, Py_NewRef(*ev));
    Py_XDECREF(*et);
    Py_XDECREF(*ev);
    Py_XDECREF(*tb);
    *et = t;
    *ev = v;
    *tb = b;
}

/* One ended span's row to the recorder, as the Python bodies inline Recorder.record:
 * appended to its current chunk, the chunk rolled when full; before a recorder runs, to
 * record_first. Returns 0, or -1 with an error set. */
static int
record(PyObject *row)
{
    PyObject *r;
    if (REC == Py_None) {
        r = PyObject_CallOneArg(RECORD_FIRST, row);
    }
    else {
        PyObject *cur = PyObject_GetAttr(REC, S_CUR);
        if (cur == NULL)
            return -1;
        int full = 0;
        if (PyList_CheckExact(cur)) {
            if (PyList_Append(cur, row) < 0) {
                Py_DECREF(cur);
                return -1;
            }
            full = PyList_GET_SIZE(cur) >= CHUNK_ROWS;
        }
        Py_DECREF(cur);
        if (!full)
            return 0;
        r = PyObject_CallMethodNoArgs(REC, S_ROLL);
    }
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* Make `span` the current span; returns the context token, or NULL with an error set. A
 * context holding nothing but the parent span (the usual case) is replaced whole: a
 * one-key dict costs less than a copy of the old one. */
static PyObject *
make_current(PyObject *ctx, int has_parent, PyObject *span)
{
    PyObject *inner = PyDict_GET_SIZE(ctx) == has_parent ? PyDict_New() : PyDict_Copy(ctx);
    if (inner == NULL)
        return NULL;
    PyObject *token = PyDict_SetItem(inner, KEY, span) < 0 ? NULL : PyContextVar_Set(VAR, inner);
    Py_DECREF(inner);
    return token;
}

/* After the call: the row to the recorder (or to end_live / record_first). Errors are
 * cleared (swallow): recording never raises into the traced program. Returns -1 with a
 * kept error set. */
static int
finish(Wrapper *self, PyObject *th, PyObject *tl, PyObject *sid, PyObject *pid,
       PyObject *start, PyObject *end)
{
    int extra = 0;
    if (EXTRA != NULL && PyDict_GET_SIZE(EXTRA)) {
        extra = PyDict_Contains(EXTRA, sid);
        if (extra < 0) {
            PyErr_Clear(); /* a dict of ints: nothing a handler could raise */
            extra = 0;
        }
    }
    if (extra) {
        PyObject *r = PyObject_CallFunctionObjArgs(END_LIVE, th, tl, sid, self->site, pid,
                                                   start, end, NULL);
        Py_XDECREF(r);
        return r == NULL ? swallow() : 0;
    }
    PyObject *row = PyTuple_Pack(7, self->site, th, tl, sid, pid, start, end);
    if (row == NULL)
        return swallow();
    /* Ints only: it can never be part of a cycle, so the collector need not see it (a
     * buffer of a million rows would otherwise be walked by each collection). */
    PyObject_GC_UnTrack(row);
    int done = record(row);
    Py_DECREF(row);
    return done < 0 ? swallow() : 0;
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
    token = make_current(ctx, parent != NULL, live);
    if (token == NULL)
        goto bail;

    /* As deep as the Python body goes (its frame counts against the recursion limit), and
     * never deeper than the C stack allows: each traced level here is a C frame (~0.5-0.8
     * KB), where CPython 3.11 runs Python-to-Python calls without one, so a program that
     * raised the recursion limit would overflow the stack (as functools.lru_cache's C
     * wrapper does) instead of recursing. */
    if (depth >= MAX_DEPTH) {
        PyErr_Format(PyExc_RecursionError,
                     "maximum recursion depth of functions traced by chiptrace's C wrapper "
                     "(%d) exceeded; CHIPTRACE_C_WRAPPER=0 traces deeper",
                     MAX_DEPTH);
    }
    else if (Py_EnterRecursiveCall(" in a function traced by chiptrace") == 0) {
        depth++;
        result = PyObject_Vectorcall(self->fn, args, nargsf, kwnames);
        depth--;
        Py_LeaveRecursiveCall();
    }

    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);
    if (et != NULL) {
        PyErr_NormalizeException(&et, &ev, &tb);
        if (tb != NULL && ev != NULL)
            PyException_SetTraceback(ev, tb);
        PyObject *r = PyObject_CallFunctionObjArgs(FAIL_LIVE, th, tl, sid,
                                                   ev ? ev : Py_None, NULL);
        if (r == NULL && swallow() < 0)
            supersede(&et, &ev, &tb);
        Py_XDECREF(r);
    }
    PyObject *end = now();
    if (PyContextVar_Reset(VAR, token) < 0)
        PyErr_Clear(); /* the function changed the context it was called in */
    if (end == NULL)
        PyErr_Clear(); /* the clock as an int: memory */
    else if (finish(self, th, tl, sid, pid, start, end) < 0) {
        supersede(&et, &ev, &tb);
        Py_CLEAR(result);
    }
    Py_XDECREF(end);
    PyErr_Restore(et, ev, tb);
    goto done;

bail:
    /* chiptrace's own failure before the call: the call runs untraced, never fails (a
     * handler's KeyboardInterrupt or SystemExit raised meanwhile is the program's) */
    if (swallow() == 0)
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

/* ---------------------------------------------------------------- span() blocks
 *
 * `with chiptrace.span(...)`: chiptrace.api.span's __enter__ and __exit__ (the Python ones
 * in api._PyBlock are the reference) as the methods of a base class, so the `with`
 * statement calls C. The slots of chiptrace.api.span (_name, _tags, _kind, _last,
 * _attributes) and of the Span it opens are read and written at their offsets, found once
 * by bind_span from the classes' member descriptors. Anything unusual (a block whose exit
 * finds another span current, an exception, a span with events or a status, a new site)
 * calls the Python functions the reference calls.
 */

static PyTypeObject *SPAN;   /* chiptrace.recording.spans.Span */
static PyObject *SITE_INDEX, *RAW_TAGS, *SITE_FN, *GENERAL_ROW, *ROW_FN, *EMPTY, *SITES;
static PyObject *S_NAMES, *S_MAX_SITES;
static Py_ssize_t B_NAME, B_TAGS, B_KIND, B_LAST, B_ATTRS;         /* span() slots */
static Py_ssize_t S_TH, S_TL, S_SID, S_PID, S_NAMEO, S_KINDO, S_TAGSO, S_START, S_END,
    S_TOKEN, S_OWNER;                                               /* Span slots */
static PyObject *S_ATTRIBUTES, *S_EVENTS, *S_LINKS, *S_STATUS, *S_FALLBACK, *S_FAIL, *S_MESSAGE;
static PyObject *S_TAG_FIELDS[4]; /* a Tags' values, in RawTags' key order */

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

/* Store a new reference in a slot, dropping the old one. */
static inline void
put(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject *old = SLOT(obj, off);
    SLOT(obj, off) = value;
    Py_XDECREF(old);
}

static PyObject *
block_enter(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    if (REC == Py_None && !OFF) {
        PyObject *r = PyObject_CallNoArgs(START); /* before the start time */
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    PyObject *ctx = NULL;
    if (PyContextVar_Get(VAR, NULL, &ctx) < 0)
        return NULL;
    if (ctx == NULL || !PyDict_Check(ctx)) {
        Py_XDECREF(ctx);
        PyErr_SetString(PyExc_RuntimeError, "chiptrace: the OpenTelemetry context is not a dict");
        return NULL;
    }
    PyObject *parent = PyDict_GetItemWithError(ctx, KEY); /* borrowed, alive with ctx */
    PyObject *s = NULL, *sid = NULL, *token = NULL;
    if (parent == NULL && PyErr_Occurred())
        goto fail;
    s = PyBaseObject_Type.tp_new(SPAN, EMPTY, NULL);
    sid = s ? PyObject_CallNoArgs(NEW_ID) : NULL;
    if (sid == NULL)
        goto fail;
    put(s, S_SID, Py_NewRef(sid));
    if (parent != NULL && Py_TYPE(parent) == SPAN) {
        put(s, S_TH, Py_XNewRef(SLOT(parent, S_TH)));
        put(s, S_TL, Py_XNewRef(SLOT(parent, S_TL)));
        put(s, S_PID, Py_XNewRef(SLOT(parent, S_SID)));
    }
    else if (parent == NULL && REMOTE == Py_None) {
        put(s, S_TH, Py_NewRef(HI));
        put(s, S_TL, Py_NewRef(sid));
        put(s, S_PID, Py_NewRef(ZERO));
    }
    else {
        PyObject *ids = PyObject_CallFunctionObjArgs(PARENT_IDS, parent ? parent : Py_None,
                                                    sid, NULL);
        if (ids == NULL)
            goto fail;
        if (!PyTuple_Check(ids) || PyTuple_GET_SIZE(ids) != 3) {
            Py_DECREF(ids);
            PyErr_SetString(PyExc_RuntimeError, "chiptrace: parent_ids");
            goto fail;
        }
        put(s, S_TH, Py_NewRef(PyTuple_GET_ITEM(ids, 0)));
        put(s, S_TL, Py_NewRef(PyTuple_GET_ITEM(ids, 1)));
        put(s, S_PID, Py_NewRef(PyTuple_GET_ITEM(ids, 2)));
        Py_DECREF(ids);
    }
    put(s, S_NAMEO, Py_XNewRef(SLOT(self, B_NAME)));
    put(s, S_KINDO, Py_XNewRef(SLOT(self, B_KIND)));
    put(s, S_TAGSO, Py_XNewRef(SLOT(self, B_TAGS)));
    put(s, S_END, PyLong_FromLong(OFF ? -1 : 0)); /* -1: never recorded; still a parent */
    PyObject *attrs = SLOT(self, B_ATTRS);
    if (attrs != NULL && attrs != Py_None) {
        int truthy = PyObject_IsTrue(attrs);
        if (truthy < 0)
            goto fail;
        if (truthy) {
            PyObject *copy = PyDict_New();
            if (copy == NULL || PyDict_Merge(copy, attrs, 1) < 0 ||
                PyObject_SetAttr(s, S_ATTRIBUTES, copy) < 0) {
                Py_XDECREF(copy);
                goto fail;
            }
            Py_DECREF(copy);
        }
    }
    token = make_current(ctx, parent != NULL, s);
    if (token == NULL)
        goto fail;
    put(s, S_TOKEN, token);
    put(s, S_OWNER, Py_NewRef(self));
    put(self, B_LAST, Py_NewRef(s));
    put(s, S_START, now());
    Py_DECREF(sid);
    Py_DECREF(ctx);
    return s;
fail:
    Py_XDECREF(sid);
    Py_XDECREF(s);
    Py_DECREF(ctx);
    return NULL;
}

/* The general row of a span without events, links or a status that has no site number (a
 * full site table): spans.general_row's row, built here, since past a full table every
 * span takes this path. Tags without static attributes travel as their values (rows.py
 * checks them once per value), so the row holds no object the collector must walk. */
static PyObject *
plain_general_row(PyObject *s, PyObject *end, PyObject *name, PyObject *tags, PyObject *kind)
{
    PyObject *key = NULL, *attrs = NULL, *status = NULL, *message = NULL, *row = NULL;
    if (Py_TYPE(tags) == (PyTypeObject *)RAW_TAGS) {
        key = Py_NewRef(PyTuple_GET_ITEM(tags, 0));
    }
    else {
        PyObject *static_attrs = PyObject_GetAttr(tags, S_ATTRIBUTES);
        if (static_attrs == NULL)
            return NULL;
        int bare = static_attrs == Py_None;
        Py_DECREF(static_attrs);
        if (!bare)
            return PyObject_CallOneArg(GENERAL_ROW, s);
        key = PyTuple_New(4);
        for (int i = 0; key != NULL && i < 4; i++) {
            PyObject *v = PyObject_GetAttr(tags, S_TAG_FIELDS[i]);
            if (v == NULL)
                Py_CLEAR(key);
            else
                PyTuple_SET_ITEM(key, i, v);
        }
        if (key == NULL)
            return NULL;
    }
    attrs = PyObject_GetAttr(s, S_ATTRIBUTES);
    status = attrs ? PyObject_GetAttr(s, S_STATUS) : NULL;
    message = status ? PyObject_GetAttr(s, S_MESSAGE) : NULL;
    if (message != NULL) {
        PyObject *fields[14] = {key, SLOT(s, S_TH), SLOT(s, S_TL), SLOT(s, S_SID),
                                SLOT(s, S_PID), SLOT(s, S_START), end, name, kind, status,
                                message, attrs, Py_None, Py_None};
        row = PyTuple_New(14);
        for (int i = 0; row != NULL && i < 14; i++)
            PyTuple_SET_ITEM(row, i, Py_XNewRef(fields[i] ? fields[i] : Py_None));
        if (row != NULL && attrs == Py_None && !PyObject_GC_IsTracked(message)) {
            PyObject_GC_UnTrack(key); /* strings and None: no cycle can pass through */
            PyObject_GC_UnTrack(row);
        }
    }
    Py_DECREF(key);
    Py_XDECREF(attrs);
    Py_XDECREF(status);
    Py_XDECREF(message);
    return row;
}

/* The row of a span that ended: plain or site row, else the reference's general one. */
static PyObject *
block_row(PyObject *s, PyObject *end)
{
    PyObject *name = SLOT(s, S_NAMEO), *tags = SLOT(s, S_TAGSO), *kind = SLOT(s, S_KINDO);
    PyObject *v;
    int plain = name != NULL && PyUnicode_CheckExact(name) && tags != NULL && kind != NULL;
    for (int i = 0; plain && i < 3; i++) {
        PyObject *attr = i == 0 ? S_EVENTS : i == 1 ? S_LINKS : S_STATUS;
        v = PyObject_GetAttr(s, attr);
        if (v == NULL)
            return NULL;
        plain = i < 2 ? v == Py_None : !PyObject_IsTrue(v);
        Py_DECREF(v);
    }
    if (!plain)
        return PyObject_CallOneArg(ROW_FN, s);
    PyObject *key = PyTuple_New(3);
    if (key == NULL)
        return NULL;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(name));
    PyTuple_SET_ITEM(key, 1, PyLong_FromVoidPtr(tags));
    PyTuple_SET_ITEM(key, 2, Py_NewRef(kind));
    if (PyTuple_GET_ITEM(key, 1) == NULL) {
        Py_DECREF(key);
        return NULL;
    }
    PyObject *site = PyDict_GetItemWithError(SITE_INDEX, key);
    Py_DECREF(key);
    Py_XINCREF(site);
    if (site == NULL) {
        if (PyErr_Occurred())
            return NULL;
        int full = PyObject_IsInstance(tags, RAW_TAGS);
        if (full == 0) { /* sites.site()'s own test, without its call: a full table */
            PyObject *names = PyObject_GetAttr(SITES, S_NAMES);
            PyObject *most = names ? PyObject_GetAttr(SITES, S_MAX_SITES) : NULL;
            Py_ssize_t limit = most ? PyLong_AsSsize_t(most) : -1;
            if (limit >= 0 && PyList_Check(names))
                full = PyList_GET_SIZE(names) >= limit;
            Py_XDECREF(names);
            Py_XDECREF(most);
            if (PyErr_Occurred())
                return NULL;
        }
        if (full < 0)
            return NULL;
        site = full ? PyLong_FromLong(-1)
                    : PyObject_CallFunctionObjArgs(SITE_FN, name, tags, kind, NULL);
        if (site == NULL)
            return NULL;
    }
    long n = PyLong_AsLong(site);
    if (n == -1 && PyErr_Occurred()) {
        Py_DECREF(site);
        return NULL;
    }
    if (n < 0) {
        Py_DECREF(site);
        return plain_general_row(s, end, name, tags, kind);
    }
    PyObject *attrs = PyObject_GetAttr(s, S_ATTRIBUTES);
    if (attrs == NULL) {
        Py_DECREF(site);
        return NULL;
    }
    Py_ssize_t extra = 0;
    if (attrs != Py_None) {
        if (!PyDict_Check(attrs)) { /* a mapping set some other way: the reference's row */
            Py_DECREF(attrs);
            Py_DECREF(site);
            return PyObject_CallOneArg(GENERAL_ROW, s);
        }
        extra = PyDict_GET_SIZE(attrs);
    }
    PyObject *row = PyTuple_New(7 + 2 * extra);
    if (row != NULL) {
        PyObject *fields[7] = {site, SLOT(s, S_TH), SLOT(s, S_TL), SLOT(s, S_SID),
                               SLOT(s, S_PID), SLOT(s, S_START), end};
        for (int i = 0; i < 7; i++)
            PyTuple_SET_ITEM(row, i, Py_XNewRef(fields[i] ? fields[i] : Py_None));
        Py_ssize_t pos = 0, i = 0;
        PyObject *k, *val;
        /* Flat, the keys then the values: see chiptrace.api._PyBlock.__exit__. */
        while (extra && PyDict_Next(attrs, &pos, &k, &val)) {
            PyTuple_SET_ITEM(row, 7 + i, Py_NewRef(k));
            PyTuple_SET_ITEM(row, 7 + extra + i, Py_NewRef(val));
            i++;
        }
    }
    Py_DECREF(attrs);
    Py_DECREF(site);
    if (row != NULL)
        PyObject_GC_UnTrack(row); /* flat: the collector need not walk a buffered row */
    return row;
}

static PyObject *
block_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *end = now();
    if (end == NULL)
        return NULL;
    PyObject *exc = nargs >= 2 ? args[1] : Py_None;
    PyObject *ctx = NULL, *s = NULL, *row = NULL, *r = NULL;
    if (PyContextVar_Get(VAR, NULL, &ctx) < 0)
        goto error;
    PyObject *cur = ctx != NULL && PyDict_Check(ctx) ? PyDict_GetItemWithError(ctx, KEY)
                                                     : NULL;
    if (cur == NULL && PyErr_Occurred())
        goto error;
    if (cur != NULL && Py_TYPE(cur) == SPAN && SLOT(cur, S_OWNER) == self) {
        s = Py_NewRef(cur);
        put(s, S_OWNER, Py_NewRef(Py_None));
    }
    else {
        s = PyObject_CallMethodNoArgs(self, S_FALLBACK);
        if (s == NULL)
            goto error;
        if (s == Py_None)
            goto done;
    }
    if (exc != Py_None) {
        r = PyObject_CallMethodOneArg(s, S_FAIL, exc);
        if (r == NULL)
            goto error;
        Py_CLEAR(r);
    }
    PyObject *token = SLOT(s, S_TOKEN);
    if (token != NULL && PyContextVar_Reset(VAR, token) < 0) {
        /* the token belongs to another context (a task or thread took over) */
        if (!PyErr_ExceptionMatches(PyExc_ValueError) &&
            !PyErr_ExceptionMatches(PyExc_RuntimeError))
            goto error;
        PyErr_Clear();
    }
    PyObject *ended = SLOT(s, S_END);
    if (ended == NULL || PyObject_IsTrue(ended))
        goto done; /* ended already (end() in the block), or tracing is off */
    put(s, S_END, Py_NewRef(end));
    row = block_row(s, end);
    if (row == NULL)
        goto error;
    if (record(row) < 0)
        goto error;
    goto done;
error:
    /* chiptrace's own failure: the block's program goes on (the reference would raise);
     * a handler's KeyboardInterrupt or SystemExit raised meanwhile is the program's */
    if (swallow() < 0) {
        Py_XDECREF(r);
        Py_XDECREF(row);
        Py_XDECREF(s);
        Py_XDECREF(ctx);
        Py_DECREF(end);
        return NULL;
    }
done:
    Py_XDECREF(r);
    Py_XDECREF(row);
    Py_XDECREF(s);
    Py_XDECREF(ctx);
    Py_DECREF(end);
    Py_RETURN_NONE;
}

static PyMethodDef block_methods[] = {
    {"__enter__", (PyCFunction)block_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))block_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "chiptrace.recording._cwrap.Block",
    .tp_doc = "The C __enter__ and __exit__ of chiptrace.span (see _cwrap.c).",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_new = PyType_GenericNew,
    .tp_methods = block_methods,
};

static int
offset_of(PyObject *cls, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyObject_GetAttrString(cls, name);
    if (d == NULL)
        return -1;
    if (Py_TYPE(d) != &PyMemberDescr_Type ||
        ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
        PyErr_Format(PyExc_TypeError, "chiptrace: %s is not a slot", name);
        Py_DECREF(d);
        return -1;
    }
    *out = ((PyMemberDescrObject *)d)->d_member->offset;
    Py_DECREF(d);
    return 0;
}

static PyObject *
bind_span(PyObject *module, PyObject *args)
{
    PyObject *block, *span, *sites, *general, *row_fn;
    if (!PyArg_ParseTuple(args, "O!O!O!OO:bind_span", &PyType_Type, &block, &PyType_Type, &span,
                          &PyModule_Type, &sites, &general, &row_fn))
        return NULL;
    PyObject *index = PyObject_GetAttrString(sites, "_index");
    PyObject *raw = index ? PyObject_GetAttrString(sites, "RawTags") : NULL;
    PyObject *site_fn = raw ? PyObject_GetAttrString(sites, "site") : NULL;
    if (site_fn == NULL || !PyDict_Check(index)) {
        Py_XDECREF(index);
        Py_XDECREF(raw);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "chiptrace: sites._index is not a dict");
        return NULL;
    }
    /* the module's own references keep these alive; ours are taken below */
    Py_DECREF(index);
    Py_DECREF(raw);
    Py_DECREF(site_fn);
    if (offset_of(block, "_name", &B_NAME) < 0 || offset_of(block, "_tags", &B_TAGS) < 0 ||
        offset_of(block, "_kind", &B_KIND) < 0 || offset_of(block, "_last", &B_LAST) < 0 ||
        offset_of(block, "_attributes", &B_ATTRS) < 0 || offset_of(span, "trace_hi", &S_TH) < 0 ||
        offset_of(span, "trace_lo", &S_TL) < 0 || offset_of(span, "span_id", &S_SID) < 0 ||
        offset_of(span, "parent_id", &S_PID) < 0 || offset_of(span, "name", &S_NAMEO) < 0 ||
        offset_of(span, "kind", &S_KINDO) < 0 || offset_of(span, "tags", &S_TAGSO) < 0 ||
        offset_of(span, "start_ns", &S_START) < 0 || offset_of(span, "end_ns", &S_END) < 0 ||
        offset_of(span, "_token", &S_TOKEN) < 0 || offset_of(span, "_owner", &S_OWNER) < 0)
        return NULL;
    Py_XSETREF(SPAN, (PyTypeObject *)Py_NewRef(span));
    Py_XSETREF(SITES, Py_NewRef(sites));
    Py_XSETREF(SITE_INDEX, Py_NewRef(index));
    Py_XSETREF(RAW_TAGS, Py_NewRef(raw));
    Py_XSETREF(SITE_FN, Py_NewRef(site_fn));
    Py_XSETREF(GENERAL_ROW, Py_NewRef(general));
    Py_XSETREF(ROW_FN, Py_NewRef(row_fn));
    Py_RETURN_NONE;
}

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
    {"bind_span", bind_span, METH_VARARGS,
     "bind_span(span_cls, Span, sites_module, general_row, row): span() in C."},
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
    EMPTY = PyTuple_New(0);
    S_ATTRIBUTES = PyUnicode_InternFromString("attributes");
    S_EVENTS = PyUnicode_InternFromString("events");
    S_LINKS = PyUnicode_InternFromString("links");
    S_STATUS = PyUnicode_InternFromString("status_code");
    S_FALLBACK = PyUnicode_InternFromString("_fallback");
    S_FAIL = PyUnicode_InternFromString("_fail");
    S_MESSAGE = PyUnicode_InternFromString("status_message");
    S_NAMES = PyUnicode_InternFromString("NAMES");
    S_MAX_SITES = PyUnicode_InternFromString("MAX_SITES");
    if (S_NAMES == NULL || S_MAX_SITES == NULL)
        return NULL;
    const char *tag_fields[4] = {"chip_id", "link_id", "op_kind", "op_precision"};
    for (int i = 0; i < 4; i++)
        if ((S_TAG_FIELDS[i] = PyUnicode_InternFromString(tag_fields[i])) == NULL)
            return NULL;
    if (EMPTY == NULL || S_ATTRIBUTES == NULL || S_EVENTS == NULL || S_LINKS == NULL ||
        S_STATUS == NULL || S_FALLBACK == NULL || S_FAIL == NULL || S_MESSAGE == NULL)
        return NULL;
    if (PyType_Ready(&BlockType) < 0)
        return NULL;
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
    Py_INCREF(&BlockType);
    if (PyModule_AddObject(m, "Block", (PyObject *)&BlockType) < 0) {
        Py_DECREF(&BlockType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
