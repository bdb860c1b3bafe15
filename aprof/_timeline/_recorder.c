/* aprof._timeline._recorder: the timeline's hot path in C. pyrecorder.py is its pure-Python
twin, of the same contract, and the typed view of both; recorder.py chooses which one runs.

Every agent-loop turn records a request and one or two spans, so at 10,000 concurrent loops
their cost is the profiler's cost. Written in Python, each was a few Python frames, two
coroutines per `async with`, an event tuple that the timeline's writer thread marshalled while
holding the GIL, and one object per operation in flight that the garbage collector tracks: the
loops' waits kept those alive across collections, and the full collections that walked them
were a third of what aprof added to a turn. Here:

- a Recorder holds a timeline's events already in marshal's format (without back-references,
  so that events written one by one can follow each other), as the items of one list; take()
  hands them over as the bytes of that list, which the writer process loads with marshal.loads;
- Span and Request begin and end without a Python frame, awaiting their __aenter__ and
  __aexit__ completes at once (no coroutine), and they are not tracked by the garbage
  collector: one only forms a cycle while it is open (its recorder's list of open ones holds
  it, linked through the span or request itself: no hashing per begin and end), and the
  timeline's close ends every open one;
- the clock is CPython's monotonic clock, the one behind time.monotonic_ns().

An event's layout is events.py's (SPAN, REQUEST, ...). A value that marshal's plain types do
not hold is written as its str(), as the writer process shows it anyway. A request learns what
it needs of its profiler from a Gate (the step now open, whether it has rollout windows, and
the admit callable), which it reads as a C struct. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <limits.h>
#include <stdint.h>
#include <string.h>

#define KIND_SPAN 0    /* events.SPAN */
#define KIND_REQUEST 1 /* events.REQUEST */

/* marshal's type codes (Python/marshal.c); the loader takes any version's. */
#define M_NONE 'N'
#define M_FALSE 'F'
#define M_TRUE 'T'
#define M_INT 'i'
#define M_LONG 'l'
#define M_FLOAT 'g'
#define M_SHORT_ASCII 'z'
#define M_ASCII 'a'
#define M_UNICODE 'u'
#define M_SMALL_TUPLE ')'
#define M_TUPLE '('
#define M_LIST '['
#define M_HEAD 5     /* M_LIST and the count: the front of a Recorder's buffer */
#define M_DEPTH 8    /* tuples nested deeper are written as their str() */

static PyObject *str_tokens;

static int64_t
now_ns(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    (void)PyTime_MonotonicRaw(&t); /* cannot fail: Python checked the clock at start */
    return t;
#else
    return _PyTime_GetMonotonicClock();
#endif
}

/* -- Ready: an awaitable that is done -------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *value;
} Ready;

static PyTypeObject Ready_Type;

static PyObject *ready_none; /* what every __aexit__ returns */

static PyObject *
ready_new(PyObject *value)
{
    Ready *self = PyObject_New(Ready, &Ready_Type);
    if (self == NULL) {
        return NULL;
    }
    self->value = Py_NewRef(value);
    return (PyObject *)self;
}

static void
ready_dealloc(Ready *self)
{
    Py_DECREF(self->value);
    PyObject_Free(self);
}

static PyObject *
ready_self(PyObject *self)
{
    return Py_NewRef(self);
}

/* `await` sends None and gets the value back at once. */
static PySendResult
ready_send(Ready *self, PyObject *arg, PyObject **result)
{
    *result = Py_NewRef(self->value);
    return PYGEN_RETURN;
}

/* NULL with StopIteration(value) set: an iterator's end that returns `value`. */
static PyObject *
stop_with(PyObject *value)
{
    PyObject *stop = PyObject_CallOneArg(PyExc_StopIteration, value);
    if (stop != NULL) {
        PyErr_SetObject(PyExc_StopIteration, stop);
        Py_DECREF(stop);
    }
    return NULL;
}

/* The iterator protocol's form of the same, which `await` uses while a trace function is
   set (a debugger, coverage). */
static PyObject *
ready_next(Ready *self)
{
    return stop_with(self->value);
}

static PyAsyncMethods ready_async = {
    .am_await = ready_self,
    .am_send = (sendfunc)ready_send,
};

static PyTypeObject Ready_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.Ready",
    .tp_basicsize = sizeof(Ready),
    .tp_dealloc = (destructor)ready_dealloc,
    .tp_as_async = &ready_async,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What __aenter__ and __aexit__ return: an awaitable that is already done.",
    .tp_iter = ready_self,
    .tp_iternext = (iternextfunc)ready_next,
};

/* -- Open: the spans and requests begun and not ended ------------------------------------ */

/* A span or request is in its recorder's list of open ones through a Link of its own, which
   holds a reference to it while it is linked. */
typedef struct Link {
    struct Link *prev; /* NULL: not linked */
    struct Link *next;
    PyObject *owner;
} Link;

/* Link `link` (of `owner`) before `head`; once only: 0 if it is linked already. */
static int
link_in(Link *head, Link *link, PyObject *owner)
{
    if (link->prev != NULL) {
        return 0;
    }
    link->owner = Py_NewRef(owner);
    link->prev = head->prev;
    link->next = head;
    head->prev->next = link;
    head->prev = link;
    return 1;
}

/* Unlink `link`: 1 if it was linked, 0 if not (ended already). Its owner's reference goes; the
   caller holds another. */
static int
link_out(Link *link)
{
    if (link->prev == NULL) {
        return 0;
    }
    link->prev->next = link->next;
    link->next->prev = link->prev;
    link->prev = link->next = NULL;
    Py_DECREF(link->owner);
    return 1;
}

/* -- Recorder: a timeline's events, in marshal's format -------------------------------- */

typedef struct {
    PyObject_HEAD
    Link open;         /* the head of the spans and requests begun and not ended */
    PyObject *on_full; /* called when an event finds no room */
    char *data;        /* M_HEAD bytes, then the events */
    Py_ssize_t size;
    Py_ssize_t capacity;
    Py_ssize_t count;
    Py_ssize_t room;
    Py_ssize_t dropped;
} Recorder;

static PyTypeObject Recorder_Type;

static int
grow(Recorder *self, Py_ssize_t more)
{
    if (self->size + more <= self->capacity) {
        return 0;
    }
    Py_ssize_t capacity = self->capacity * 2;
    while (capacity < self->size + more) {
        capacity *= 2;
    }
    char *data = PyMem_Realloc(self->data, (size_t)capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->data = data;
    self->capacity = capacity;
    return 0;
}

static inline int
put_raw(Recorder *self, const void *bytes, Py_ssize_t n)
{
    if (grow(self, n) < 0) {
        return -1;
    }
    memcpy(self->data + self->size, bytes, (size_t)n);
    self->size += n;
    return 0;
}

static int
put_byte(Recorder *self, char c)
{
    return put_raw(self, &c, 1);
}

static void
le32(unsigned char *out, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        out[i] = (unsigned char)(v >> (8 * i));
    }
}

/* A code and a 32-bit little-endian count or value. */
static int
put_code_i32(Recorder *self, char code, int32_t v)
{
    unsigned char out[5];
    out[0] = (unsigned char)code;
    le32(out + 1, (uint32_t)v);
    return put_raw(self, out, 5);
}

static int
put_int64(Recorder *self, int64_t v)
{
    if (v >= INT32_MIN && v <= INT32_MAX) {
        return put_code_i32(self, M_INT, (int32_t)v);
    }
    /* M_LONG: the number of 15-bit digits (negative for a negative number), then the
       digits from the lowest, 16 bits each; the highest is never 0. */
    uint64_t rest = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    unsigned char out[5 + 2 * 5];
    int32_t digits = 0;
    while (rest) {
        out[5 + 2 * digits] = (unsigned char)(rest & 0xff);
        out[6 + 2 * digits] = (unsigned char)((rest >> 8) & 0x7f);
        rest >>= 15;
        digits++;
    }
    out[0] = M_LONG;
    le32(out + 1, (uint32_t)(v < 0 ? -digits : digits));
    return put_raw(self, out, 5 + 2 * digits);
}

static int put_tuple_head(Recorder *self, Py_ssize_t n);

/* A string of `n` bytes: its code and length, then the bytes. */
static int
put_text(Recorder *self, char code, const char *bytes, Py_ssize_t n)
{
    if (n > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "a timeline string is limited to 2 GiB");
        return -1;
    }
    int head;
    if (code == M_SHORT_ASCII) {
        unsigned char out[2] = {M_SHORT_ASCII, (unsigned char)n};
        head = put_raw(self, out, 2);
    }
    else {
        head = put_code_i32(self, code, (int32_t)n);
    }
    return head < 0 ? -1 : put_raw(self, bytes, n);
}

static int
put_str(Recorder *self, PyObject *v)
{
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    if (PyUnicode_IS_ASCII(v)) {
        return put_text(
            self, n < 256 ? M_SHORT_ASCII : M_ASCII, (const char *)PyUnicode_1BYTE_DATA(v), n);
    }
    PyObject *utf8 = PyUnicode_AsEncodedString(v, "utf8", "surrogatepass");
    if (utf8 == NULL) {
        return -1;
    }
    int done = put_text(self, M_UNICODE, PyBytes_AS_STRING(utf8), PyBytes_GET_SIZE(utf8));
    Py_DECREF(utf8);
    return done;
}

/* An int beyond 64 bits, digit by digit (marshal's M_LONG, as put_int64 writes it). */
static int
put_big_int(Recorder *self, PyObject *v)
{
    /* On an exact int, which runs no code of a subclass's. */
    PyObject *rest = PyNumber_Index(v), *zero = PyLong_FromLong(0);
    PyObject *mask = PyLong_FromLong(0x7fff), *shift = PyLong_FromLong(15);
    int negative = -1;
    if (rest != NULL && zero != NULL && mask != NULL && shift != NULL) {
        negative = PyObject_RichCompareBool(rest, zero, Py_LT);
        if (negative == 1) {
            Py_SETREF(rest, PyNumber_Negative(rest));
        }
    }
    Py_ssize_t head = self->size;
    int done = negative < 0 || rest == NULL ? -1 : put_code_i32(self, M_LONG, 0);
    int32_t digits = 0;
    while (done == 0) {
        int more = PyObject_IsTrue(rest);
        if (more <= 0) {
            done = more;
            break;
        }
        PyObject *digit = PyNumber_And(rest, mask);
        long d = digit == NULL ? -1 : PyLong_AsLong(digit);
        Py_XDECREF(digit);
        Py_SETREF(rest, d < 0 ? NULL : PyNumber_Rshift(rest, shift));
        unsigned char out[2] = {(unsigned char)(d & 0xff), (unsigned char)((d >> 8) & 0x7f)};
        done = rest == NULL ? -1 : put_raw(self, out, 2);
        digits++;
    }
    if (done == 0) {
        le32((unsigned char *)self->data + head + 1, (uint32_t)(negative ? -digits : digits));
    }
    Py_XDECREF(rest);
    Py_XDECREF(zero);
    Py_XDECREF(mask);
    Py_XDECREF(shift);
    return done;
}

/* Whether marshal's format holds `v` as it is: None, bool, int, float, str (subclasses as
   their base) and tuples of them, nested up to M_DEPTH. Runs no Python code. */
static int
is_plain(PyObject *v, int depth)
{
    if (v == Py_None || PyBool_Check(v) || PyUnicode_Check(v) || PyLong_Check(v) ||
        PyFloat_Check(v)) {
        return 1;
    }
    if (!PyTuple_Check(v) || depth >= M_DEPTH) {
        return 0;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++) {
        if (!is_plain(PyTuple_GET_ITEM(v, i), depth + 1)) {
            return 0;
        }
    }
    return 1;
}

/* `v` made plain (a new reference): itself if it is, else with every value that is not
   replaced by its str(). This is where recording runs Python code, before an event is
   written: a str() may record events of its own, which then come first. */
static PyObject *
plain(PyObject *v, int depth)
{
    if (is_plain(v, depth)) {
        return Py_NewRef(v);
    }
    if (PyTuple_Check(v) && depth < M_DEPTH) {
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        PyObject *copy = PyTuple_New(n);
        for (Py_ssize_t i = 0; copy != NULL && i < n; i++) {
            PyObject *item = plain(PyTuple_GET_ITEM(v, i), depth + 1);
            if (item == NULL) {
                Py_CLEAR(copy);
                break;
            }
            PyTuple_SET_ITEM(copy, i, item);
        }
        return copy;
    }
    PyObject *text = PyObject_Str(v);
    if (text == NULL) {
        /* A str() that raises must not break the code being recorded: its type says what
           it was. */
        PyErr_Clear();
        text = PyUnicode_FromFormat("<unprintable %s>", Py_TYPE(v)->tp_name);
    }
    else if (!PyUnicode_CheckExact(text)) {
        Py_SETREF(text, PyUnicode_FromObject(text)); /* a str subclass from __str__ */
    }
    return text;
}

/* A plain value (see is_plain) in marshal's format; runs no Python code. */
static int
put_value(Recorder *self, PyObject *v)
{
    if (v == Py_None) {
        return put_byte(self, M_NONE);
    }
    if (v == Py_True || v == Py_False) {
        return put_byte(self, v == Py_True ? M_TRUE : M_FALSE);
    }
    if (PyUnicode_Check(v)) {
        return put_str(self, v);
    }
    if (PyLong_Check(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (n == -1 && PyErr_Occurred()) {
            return -1;
        }
        return overflow ? put_big_int(self, v) : put_int64(self, n);
    }
    if (PyFloat_Check(v)) {
        unsigned char out[9] = {M_FLOAT};
        if (PyFloat_Pack8(PyFloat_AS_DOUBLE(v), (char *)out + 1, 1) < 0) {
            return -1;
        }
        return put_raw(self, out, 9);
    }
    if (PyTuple_Check(v)) {
        Py_ssize_t n = PyTuple_GET_SIZE(v);
        if (put_tuple_head(self, n) < 0) {
            return -1;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            if (put_value(self, PyTuple_GET_ITEM(v, i)) < 0) {
                return -1;
            }
        }
        return 0;
    }
    PyErr_Format(PyExc_SystemError, "aprof._timeline._recorder: %.200s is not plain", Py_TYPE(v)->tp_name);
    return -1;
}

static int
put_tuple_head(Recorder *self, Py_ssize_t n)
{
    if (n < 256) {
        unsigned char out[2] = {M_SMALL_TUPLE, (unsigned char)n};
        return put_raw(self, out, 2);
    }
    return put_code_i32(self, M_TUPLE, (int32_t)n);
}

/* Whether one more event fits: 1 if so, 0 if it is dropped (and counted), -1 on error. */
static int
reserve(Recorder *self)
{
    if (self->count >= self->room) {
        PyObject *called = PyObject_CallNoArgs(self->on_full);
        if (called == NULL) {
            return -1;
        }
        Py_DECREF(called);
        if (self->count >= self->room) {
            self->dropped++;
            return 0;
        }
    }
    return 1;
}

/* Close an event begun at `mark` (after reserve): counted if `done` is 0, taken back if not. */
static int
finish(Recorder *self, Py_ssize_t mark, int done)
{
    if (done < 0) {
        self->size = mark;
        return -1;
    }
    self->count++;
    return 0;
}

static PyObject *
recorder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *on_full;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Recorder() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Recorder", 1, 1, &on_full)) {
        return NULL;
    }
    if (!PyCallable_Check(on_full)) {
        PyErr_SetString(PyExc_TypeError, "Recorder(on_full): on_full must be callable");
        return NULL;
    }
    Recorder *self = (Recorder *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->on_full = Py_NewRef(on_full);
    self->open.prev = self->open.next = &self->open;
    self->data = PyMem_Malloc(1 << 16);
    if (self->data == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->capacity = 1 << 16;
    self->size = M_HEAD;
    return (PyObject *)self;
}

static int
recorder_traverse(Recorder *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_full);
    return 0;
}

static int
recorder_clear(Recorder *self)
{
    /* No open one is left here: each holds its recorder, which keeps it from being freed,
       and from being collected (spans and requests are not tracked). */
    Py_CLEAR(self->on_full);
    return 0;
}

static void
recorder_dealloc(Recorder *self)
{
    PyObject_GC_UnTrack(self);
    recorder_clear(self);
    PyMem_Free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
recorder_add(Recorder *self, PyObject *event)
{
    if (!PyTuple_Check(event)) {
        PyErr_Format(PyExc_TypeError, "an event is a tuple, not %.200s", Py_TYPE(event)->tp_name);
        return NULL;
    }
    PyObject *written = plain(event, 0);
    if (written == NULL) {
        return NULL;
    }
    int fits = reserve(self);
    Py_ssize_t mark = self->size;
    int done = fits == 1 ? finish(self, mark, put_value(self, written)) : fits;
    Py_DECREF(written);
    if (done < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
recorder_take(Recorder *self, PyObject *unused)
{
    self->data[0] = M_LIST;
    le32((unsigned char *)self->data + 1, (uint32_t)self->count);
    PyObject *taken = PyBytes_FromStringAndSize(self->data, self->size);
    if (taken != NULL) {
        self->size = M_HEAD;
        self->count = 0;
    }
    return taken;
}

/* `recorder.open`: a list of the spans and requests begun and not ended, in the order begun. */
static PyObject *
recorder_get_open(Recorder *self, void *closure)
{
    PyObject *open = PyList_New(0);
    for (Link *link = self->open.next; open != NULL && link != &self->open; link = link->next) {
        if (PyList_Append(open, link->owner) < 0) {
            Py_CLEAR(open);
        }
    }
    return open;
}

static PyGetSetDef recorder_getset[] = {
    {"open", (getter)recorder_get_open, NULL,
     "The spans and requests begun and not ended yet, in the order begun (a new list).", NULL},
    {NULL},
};

static PyMethodDef recorder_methods[] = {
    {"add", (PyCFunction)recorder_add, METH_O,
     "add(event): record an event tuple (steps and windows; spans and requests record "
     "themselves)."},
    {"take", (PyCFunction)recorder_take, METH_NOARGS,
     "take() -> bytes: the events recorded since the last take, as marshal's bytes of a "
     "list; the recorder holds none after."},
    {NULL},
};

static PyMemberDef recorder_members[] = {
    {"room", T_PYSSIZET, offsetof(Recorder, room), 0,
     "How many events the recorder may hold before it calls on_full."},
    {"count", T_PYSSIZET, offsetof(Recorder, count), READONLY, "Events held."},
    {"dropped", T_PYSSIZET, offsetof(Recorder, dropped), READONLY,
     "Events that found no room, even after on_full, over the recorder's life."},
    {NULL},
};

static PyTypeObject Recorder_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_dealloc = (destructor)recorder_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Recorder(on_full): a timeline's events, held as marshal's bytes until taken.\n\n"
              "An event that finds `count >= room` calls on_full() first (which may take the "
              "events\nand raise the room) and is dropped and counted if there is no room "
              "then.",
    .tp_traverse = (traverseproc)recorder_traverse,
    .tp_clear = (inquiry)recorder_clear,
    .tp_methods = recorder_methods,
    .tp_members = recorder_members,
    .tp_getset = recorder_getset,
    .tp_new = recorder_new,
};

/* -- what Span and Request share ------------------------------------------------------- */

/* The note of what `__exit__` ends: None, or the exception's type name. */
static PyObject *
note_of(PyObject *exc_type)
{
    if (exc_type == Py_None) {
        return Py_NewRef(Py_None);
    }
    if (PyType_Check(exc_type)) {
        return PyType_GetName((PyTypeObject *)exc_type);
    }
    return PyObject_Str(exc_type);
}

static int
check_recorder(PyObject *recorder)
{
    if (Py_TYPE(recorder) == &Recorder_Type) {
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "expected a Recorder, not %.200s", Py_TYPE(recorder)->tp_name);
    return -1;
}

static int
check_end(Py_ssize_t nargs, PyObject *const *args, int64_t *end)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "_end(end, note) takes 2 arguments, got %zd", nargs);
        return -1;
    }
    *end = PyLong_AsLongLong(args[0]);
    return *end == -1 && PyErr_Occurred() ? -1 : 0;
}

static int
check_exit(const char *method, Py_ssize_t nargs)
{
    if (nargs == 3) {
        return 0;
    }
    PyErr_Format(
        PyExc_TypeError, "%s(exc_type, exc, tb) takes 3 arguments, got %zd", method, nargs);
    return -1;
}

/* -- Span ------------------------------------------------------------------------------ */

/* The attrs are copied into the span, keys then values: holding the caller's dict instead kept
   a garbage-collector-allocated object alive per open span, and that made the full
   collections of a process with thousands of open turns more frequent and longer (10,000 agent
   loops: a third more collection time). */
typedef struct {
    PyObject_VAR_HEAD /* ob_size: 2 * the number of attrs */
    Recorder *recorder;
    Link link; /* in the recorder's open ones while it is */
    PyObject *name;
    PyObject *step;
    int64_t begin;
    PyObject *attrs[1];
} Span;

static PyTypeObject Span_Type;

static PyObject *
span_make(PyObject *recorder, PyObject *name, PyObject *attrs, PyObject *step)
{
    if (check_recorder(recorder) < 0) {
        return NULL;
    }
    if (!PyDict_Check(attrs)) {
        PyErr_Format(
            PyExc_TypeError, "Span attrs must be a dict, not %.200s", Py_TYPE(attrs)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(attrs), pos = 0, i = 0;
    Span *self = PyObject_NewVar(Span, &Span_Type, 2 * n);
    if (self == NULL) {
        return NULL;
    }
    self->recorder = (Recorder *)Py_NewRef(recorder);
    self->link.prev = self->link.next = NULL;
    self->name = Py_NewRef(name);
    self->step = Py_NewRef(step);
    self->begin = 0;
    PyObject *key, *value;
    while (i < n && PyDict_Next(attrs, &pos, &key, &value)) {
        self->attrs[i] = Py_NewRef(key);
        self->attrs[n + i] = Py_NewRef(value);
        i++;
    }
    for (; i < n; i++) { /* a dict that shrank while being read: cannot happen, kept whole */
        self->attrs[i] = Py_NewRef(Py_None);
        self->attrs[n + i] = Py_NewRef(Py_None);
    }
    return (PyObject *)self;
}

static PyObject *
span_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(
            PyExc_TypeError, "Span(recorder, name, attrs, step) takes 4 positional arguments");
        return NULL;
    }
    return span_make(args[0], args[1], args[2], args[3]);
}

static PyObject *
span_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *recorder, *name, *attrs, *step;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Span() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Span", 4, 4, &recorder, &name, &attrs, &step)) {
        return NULL;
    }
    return span_make(recorder, name, attrs, step);
}

static void
span_dealloc(Span *self)
{
    Py_DECREF(self->recorder);
    Py_DECREF(self->name);
    Py_DECREF(self->step);
    for (Py_ssize_t i = 0; i < Py_SIZE(self); i++) {
        Py_DECREF(self->attrs[i]);
    }
    PyObject_Free(self);
}

static int
span_begin(Span *self)
{
    self->begin = now_ns();
    link_in(&self->recorder->open, &self->link, (PyObject *)self);
    return 0;
}

/* The span's attrs made plain (see plain): NULL and no error if they are already, a tuple of
   them (keys, then values) if not, NULL with an error on failure. */
static PyObject *
plain_attrs(Span *self)
{
    Py_ssize_t n = Py_SIZE(self);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_plain(self->attrs[i], 1)) {
            PyObject *copy = PyTuple_New(n);
            for (Py_ssize_t j = 0; copy != NULL && j < n; j++) {
                PyObject *item = plain(self->attrs[j], 1);
                if (item == NULL) {
                    Py_CLEAR(copy);
                    break;
                }
                PyTuple_SET_ITEM(copy, j, item);
            }
            return copy;
        }
    }
    return NULL;
}

/* (SPAN, name, begin_ns, end_ns, step, note, *keys, *values), of plain values. */
static int
put_span(Recorder *rec, Span *self, int64_t end, PyObject *name, PyObject *step, PyObject *note,
         PyObject *const *attrs)
{
    Py_ssize_t n = Py_SIZE(self);
    if (put_tuple_head(rec, 6 + n) < 0 || put_int64(rec, KIND_SPAN) < 0 ||
        put_value(rec, name) < 0 || put_int64(rec, self->begin) < 0 ||
        put_int64(rec, end) < 0 || put_value(rec, step) < 0 || put_value(rec, note) < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (put_value(rec, attrs[i]) < 0) {
            return -1;
        }
    }
    return 0;
}

/* Record the span as ended at `end` with `note`, unless it ended already (at the close). */
static int
span_end(Span *self, int64_t end, PyObject *note)
{
    Recorder *rec = self->recorder;
    if (!link_out(&self->link)) {
        return 0;
    }
    PyObject *name = plain(self->name, 1), *step = plain(self->step, 1);
    PyObject *why = plain(note, 1), *copy = plain_attrs(self);
    int done = -1;
    if (name != NULL && step != NULL && why != NULL && !PyErr_Occurred()) {
        PyObject *const *attrs = copy == NULL ? self->attrs : &PyTuple_GET_ITEM(copy, 0);
        int fits = reserve(rec);
        Py_ssize_t mark = rec->size;
        done = fits == 1 ? finish(rec, mark, put_span(rec, self, end, name, step, why, attrs))
                         : fits;
    }
    Py_XDECREF(name);
    Py_XDECREF(step);
    Py_XDECREF(why);
    Py_XDECREF(copy);
    return done;
}

static PyObject *
span_enter(Span *self, PyObject *unused)
{
    if (span_begin(self) < 0) {
        return NULL;
    }
    return Py_NewRef(self);
}

static PyObject *
span_aenter(Span *self, PyObject *unused)
{
    if (span_begin(self) < 0) {
        return NULL;
    }
    return ready_new((PyObject *)self);
}

static int
span_exit_common(Span *self, PyObject *exc_type)
{
    int64_t end = now_ns();
    PyObject *note = note_of(exc_type);
    if (note == NULL) {
        return -1;
    }
    int done = span_end(self, end, note);
    Py_DECREF(note);
    return done;
}

static PyObject *
span_exit(Span *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_exit("__exit__", nargs) < 0 || span_exit_common(self, args[0]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
span_aexit(Span *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_exit("__aexit__", nargs) < 0 || span_exit_common(self, args[0]) < 0) {
        return NULL;
    }
    return Py_NewRef(ready_none);
}

static PyObject *
span_end_method(Span *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t end;
    if (check_end(nargs, args, &end) < 0 || span_end(self, end, args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef span_methods[] = {
    {"__enter__", (PyCFunction)span_enter, METH_NOARGS, "Begin the span."},
    {"__exit__", (PyCFunction)(void (*)(void))span_exit, METH_FASTCALL,
     "End the span; noted with the exception's type name if one is raised."},
    {"__aenter__", (PyCFunction)span_aenter, METH_NOARGS,
     "Begin the span; the awaitable returned is done."},
    {"__aexit__", (PyCFunction)(void (*)(void))span_aexit, METH_FASTCALL,
     "End the span as __exit__ does; the awaitable returned is done."},
    {"_end", (PyCFunction)(void (*)(void))span_end_method, METH_FASTCALL,
     "_end(end, note): record the span as ended at `end` (monotonic ns) with `note`, unless "
     "it ended already."},
    {NULL},
};

static PyTypeObject Span_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.Span",
    .tp_basicsize = offsetof(Span, attrs),
    .tp_itemsize = sizeof(PyObject *),
    .tp_dealloc = (destructor)span_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Span(recorder, name, attrs, step): one timeline span, for `with` or `async "
              "with`;\nrecorded when it ends.",
    .tp_methods = span_methods,
    .tp_new = span_new,
    .tp_vectorcall = span_vectorcall,
};

/* -- NullSpan: what prof.span gives while the timeline is off ------------------------ */

static PyObject *null_ready; /* what NULL_SPAN.__aenter__ returns: done, with NULL_SPAN */

static PyObject *
null_enter(PyObject *self, PyObject *unused)
{
    return Py_NewRef(self);
}

static PyObject *
null_exit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_exit("__exit__", nargs) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
null_aenter(PyObject *self, PyObject *unused)
{
    return Py_NewRef(null_ready);
}

static PyObject *
null_aexit(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_exit("__aexit__", nargs) < 0) {
        return NULL;
    }
    return Py_NewRef(ready_none);
}

static PyMethodDef null_methods[] = {
    {"__enter__", (PyCFunction)null_enter, METH_NOARGS, "Nothing to begin."},
    {"__exit__", (PyCFunction)(void (*)(void))null_exit, METH_FASTCALL, "Nothing to record."},
    {"__aenter__", (PyCFunction)null_aenter, METH_NOARGS,
     "Nothing to begin; the awaitable returned is done."},
    {"__aexit__", (PyCFunction)(void (*)(void))null_aexit, METH_FASTCALL,
     "Nothing to record; the awaitable returned is done."},
    {NULL},
};

static PyTypeObject NullSpan_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.NullSpan",
    .tp_basicsize = sizeof(PyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "What prof.span gives while the timeline is off: a span that records nothing "
              "(the module's NULL_SPAN).",
    .tp_methods = null_methods,
};

typedef struct {
    PyObject_HEAD
} NullSpan;

static NullSpan null_span = {PyObject_HEAD_INIT(&NullSpan_Type)}; /* NULL_SPAN: never freed */

/* -- Tally: the requests an active window admitted ------------------------------------- */

typedef struct {
    PyObject_HEAD
    long long admitted;
} Tally;

static PyTypeObject Tally_Type;

static PyObject *
tally_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if ((kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) || PyTuple_GET_SIZE(args) > 0) {
        PyErr_SetString(PyExc_TypeError, "Tally() takes no arguments");
        return NULL;
    }
    Tally *self = (Tally *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->admitted = 0;
    }
    return (PyObject *)self;
}

static PyMemberDef tally_members[] = {
    {"admitted", T_LONGLONG, offsetof(Tally, admitted), 0, "Requests counted so far."},
    {NULL},
};

static PyTypeObject Tally_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.Tally",
    .tp_basicsize = sizeof(Tally),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tally(): the requests a window admitted while active; a gate's `active` holds "
              "one\nper replica whose window is active, and counts into it without calling "
              "admit.",
    .tp_members = tally_members,
    .tp_new = tally_new,
};

/* -- Gate: what a request asks of its profiler ------------------------------------------ */

typedef struct {
    PyObject_HEAD
    PyObject *admit;  /* called with the request while `live`, unless `active` admits it */
    PyObject *active; /* dict: replica (an int) -> Tally of its active window */
    PyObject *step;  /* the global step now open, or None */
    PyObject *trace_salt; /* None, or an exact str of 16 lowercase hex digits, not all 0 */
    char live;       /* the step now open has rollout windows */
    long long first_ns; /* the first request of `step` entered then (0: none yet) */
    long long last_ns;  /* the last request of `step` to end ended then (0: none yet) */
} Gate;

static PyTypeObject Gate_Type;

static PyObject *
gate_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *admit;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Gate() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Gate", 1, 1, &admit)) {
        return NULL;
    }
    if (!PyCallable_Check(admit)) {
        PyErr_SetString(PyExc_TypeError, "Gate(admit): admit must be callable");
        return NULL;
    }
    Gate *self = (Gate *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->active = PyDict_New();
    if (self->active == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->admit = Py_NewRef(admit);
    self->step = Py_NewRef(Py_None);
    self->trace_salt = Py_NewRef(Py_None);
    self->live = 0;
    self->first_ns = 0;
    self->last_ns = 0;
    return (PyObject *)self;
}

static int
gate_traverse(Gate *self, visitproc visit, void *arg)
{
    Py_VISIT(self->admit);
    Py_VISIT(self->active);
    Py_VISIT(self->step);
    return 0;
}

static int
gate_clear(Gate *self)
{
    Py_CLEAR(self->admit);
    Py_CLEAR(self->active);
    Py_CLEAR(self->step);
    return 0;
}

static void
gate_dealloc(Gate *self)
{
    PyObject_GC_UnTrack(self);
    gate_clear(self);
    Py_XDECREF(self->trace_salt); /* None or a str: never part of a cycle */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
gate_get_trace_salt(Gate *self, void *closure)
{
    return Py_NewRef(self->trace_salt);
}

/* Whether `text` (an exact str) is 16 lowercase hex digits, not all zero. */
static int
is_salt(PyObject *text)
{
    if (PyUnicode_GET_LENGTH(text) != 16 || !PyUnicode_IS_ASCII(text)) {
        return 0;
    }
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(text);
    int zero = 1;
    for (int i = 0; i < 16; i++) {
        if (!((c[i] >= '0' && c[i] <= '9') || (c[i] >= 'a' && c[i] <= 'f'))) {
            return 0;
        }
        zero &= c[i] == '0';
    }
    return !zero;
}

/* `gate.trace_salt = s`: 16 lowercase hex digits, not all zero (a str subclass's own
   characters, kept as a plain str), or None. */
static int
gate_set_trace_salt(Gate *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete trace_salt");
        return -1;
    }
    if (value != Py_None && !PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError,
                     "trace_salt must be a str of 16 lowercase hex digits or None, not %.200s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    /* A subclass's own characters, whatever it overrides: no code of its runs. */
    PyObject *text = value == Py_None ? Py_NewRef(value) : PyUnicode_FromObject(value);
    if (text == NULL) {
        return -1;
    }
    if (text != Py_None && !is_salt(text)) {
        Py_DECREF(text);
        PyErr_SetString(PyExc_ValueError,
                        "trace_salt must be 16 lowercase hex digits, not all zero");
        return -1;
    }
    Py_SETREF(self->trace_salt, text);
    return 0;
}

static PyMemberDef gate_members[] = {
    {"admit", T_OBJECT, offsetof(Gate, admit), READONLY,
     "Called with each request while `live`: None if it may go now, else what it awaits "
     "first."},
    {"active", T_OBJECT, offsetof(Gate, active), READONLY,
     "Replica (an int) -> Tally of its active window in the open step: while `live`, a "
     "request to\none is counted there and marked captured, without calling admit."},
    {"step", T_OBJECT, offsetof(Gate, step), 0, "The global step now open, if any."},
    {"live", T_BOOL, offsetof(Gate, live), 0,
     "The step now open has rollout windows: requests are admitted."},
    {"first_ns", T_LONGLONG, offsetof(Gate, first_ns), 0,
     "When the first request of `step` entered (monotonic ns); 0 until one has."},
    {"last_ns", T_LONGLONG, offsetof(Gate, last_ns), 0,
     "When the last request of `step` to end ended (monotonic ns); 0 until one has."},
    {NULL},
};

static PyGetSetDef gate_getset[] = {
    {"trace_salt", (getter)gate_get_trace_salt, (setter)gate_set_trace_salt,
     "The run's part of each trace id: 16 lowercase hex digits, not all zero; None: requests "
     "give no traceparent.",
     NULL},
    {NULL},
};

static PyTypeObject Gate_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.Gate",
    .tp_basicsize = sizeof(Gate),
    .tp_dealloc = (destructor)gate_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Gate(admit): what a request asks of its profiler as it enters, and nothing "
              "more:\nthe step now open, whether it has rollout windows, and admit(request); "
              "trace_salt\nmakes the run's trace ids (see Request.traceparent).",
    .tp_traverse = (traverseproc)gate_traverse,
    .tp_clear = (inquiry)gate_clear,
    .tp_members = gate_members,
    .tp_getset = gate_getset,
    .tp_new = gate_new,
};

/* -- Request --------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    Gate *gate;
    Recorder *recorder; /* NULL while the timeline is off */
    Link link;          /* in the recorder's open ones while it is */
    PyObject *replica;
    PyObject *request_id;
    PyObject *step;
    long long tokens;
    long long prompt_tokens;
    PyObject *trajectory; /* None or an exact str of at most M_TRAJECTORY characters */
    long long turn;       /* -1: None */
    int64_t begin;
    char gated;
    char captured;
    char entering; /* __aenter__ returned the request itself, to be awaited once */
} Request;

static PyTypeObject Request_Type;

#define M_TRAJECTORY 256 /* the longest trajectory, in characters */

static PyObject *
request_make(PyObject *gate, PyObject *recorder, PyObject *replica, PyObject *request_id)
{
    if (Py_TYPE(gate) != &Gate_Type) {
        PyErr_Format(PyExc_TypeError, "expected a Gate, not %.200s", Py_TYPE(gate)->tp_name);
        return NULL;
    }
    if (recorder != Py_None && check_recorder(recorder) < 0) {
        return NULL;
    }
    Request *self = PyObject_New(Request, &Request_Type);
    if (self == NULL) {
        return NULL;
    }
    self->gate = (Gate *)Py_NewRef(gate);
    self->recorder = recorder == Py_None ? NULL : (Recorder *)Py_NewRef(recorder);
    self->link.prev = self->link.next = NULL;
    self->replica = Py_NewRef(replica);
    self->request_id = Py_NewRef(request_id);
    self->step = Py_NewRef(Py_None);
    self->tokens = 0;
    self->prompt_tokens = 0;
    self->trajectory = Py_NewRef(Py_None);
    self->turn = -1;
    self->begin = 0;
    self->gated = 0;
    self->captured = 0;
    self->entering = 0;
    return (PyObject *)self;
}

static PyObject *
request_vectorcall(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) > 0)) {
        PyErr_SetString(PyExc_TypeError,
                        "Request(gate, recorder, replica, request_id) takes 4 positional "
                        "arguments");
        return NULL;
    }
    return request_make(args[0], args[1], args[2], args[3]);
}

static PyObject *
request_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *gate, *recorder, *replica, *request_id;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "Request() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "Request", 4, 4, &gate, &recorder, &replica, &request_id)) {
        return NULL;
    }
    return request_make(gate, recorder, replica, request_id);
}

static void
request_dealloc(Request *self)
{
    Py_DECREF(self->gate);
    Py_XDECREF(self->recorder);
    Py_DECREF(self->replica);
    Py_DECREF(self->request_id);
    Py_DECREF(self->step);
    Py_XDECREF(self->trajectory);
    PyObject_Free(self);
}

/* (REQUEST, begin_ns, end_ns, replica, request_id, step, gated, captured, tokens,
   prompt_tokens, trajectory, turn, note), of plain values; trajectory and turn None when
   not set. */
static int
put_request(Recorder *rec, Request *self, int64_t end, PyObject *replica, PyObject *request_id,
            PyObject *step, PyObject *trajectory, PyObject *note)
{
    return put_tuple_head(rec, 13) < 0 || put_int64(rec, KIND_REQUEST) < 0 ||
                   put_int64(rec, self->begin) < 0 || put_int64(rec, end) < 0 ||
                   put_value(rec, replica) < 0 || put_value(rec, request_id) < 0 ||
                   put_value(rec, step) < 0 ||
                   put_byte(rec, self->gated ? M_TRUE : M_FALSE) < 0 ||
                   put_byte(rec, self->captured ? M_TRUE : M_FALSE) < 0 ||
                   put_int64(rec, self->tokens) < 0 ||
                   put_int64(rec, self->prompt_tokens) < 0 ||
                   put_value(rec, trajectory) < 0 ||
                   (self->turn < 0 ? put_byte(rec, M_NONE) : put_int64(rec, self->turn)) < 0 ||
                   put_value(rec, note) < 0
               ? -1
               : 0;
}

/* Record the request as ended at `end` with `note`, unless it ended already (or the timeline
   is off). */
static int
request_end(Request *self, int64_t end, PyObject *note)
{
    Recorder *rec = self->recorder;
    if (rec == NULL) {
        return 0;
    }
    if (!link_out(&self->link)) {
        return 0;
    }
    PyObject *replica = plain(self->replica, 1), *request_id = plain(self->request_id, 1);
    PyObject *step = plain(self->step, 1), *why = plain(note, 1);
    /* Plain already; held, as on_full (or a str() above) may set another. */
    PyObject *trajectory = Py_NewRef(self->trajectory);
    int done = -1;
    if (replica != NULL && request_id != NULL && step != NULL && why != NULL) {
        int fits = reserve(rec);
        Py_ssize_t mark = rec->size;
        done = fits == 1 ? finish(rec, mark,
                                  put_request(rec, self, end, replica, request_id, step,
                                              trajectory, why))
                         : fits;
    }
    Py_XDECREF(replica);
    Py_XDECREF(request_id);
    Py_XDECREF(step);
    Py_DECREF(trajectory);
    Py_XDECREF(why);
    return done;
}

/* `async with prof.request(...)`: take the step, begin the span, and let the request go;
   while the step has rollout windows, the gate's `admit` counts it first and may give an
   awaitable that lets it go later. */
static PyObject *
request_aenter(Request *self, PyObject *unused)
{
    Gate *gate = self->gate;
    Py_SETREF(self->step, Py_NewRef(gate->step == NULL ? Py_None : gate->step));
    self->begin = now_ns();
    if (gate->first_ns == 0) {
        gate->first_ns = self->begin;
    }
    if (self->recorder != NULL) {
        link_in(&self->recorder->open, &self->link, (PyObject *)self);
    }
    if (gate->live) {
        if (PyDict_GET_SIZE(gate->active) > 0 && PyLong_CheckExact(self->replica)) {
            /* An int's hash and equality run no Python code. */
            PyObject *tally = PyDict_GetItemWithError(gate->active, self->replica);
            if (tally != NULL && Py_IS_TYPE(tally, &Tally_Type)) {
                ((Tally *)tally)->admitted++;
                self->captured = 1;
                self->entering = 1;
                return Py_NewRef(self);
            }
            PyErr_Clear(); /* not found, or a lookup that failed: admit decides */
        }
        PyObject *wait = PyObject_CallOneArg(gate->admit, (PyObject *)self);
        if (wait == NULL) {
            /* No __aexit__ follows a failed __aenter__: the request ends here. */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyObject *note = PyType_GetName((PyTypeObject *)type);
            if (note == NULL || request_end(self, now_ns(), note) < 0) {
                PyErr_Clear(); /* the exception that ended the request is the one to raise */
            }
            Py_XDECREF(note);
            PyErr_Restore(type, value, tb);
            return NULL;
        }
        if (wait != Py_None) {
            return wait;
        }
        Py_DECREF(wait);
    }
    /* Its own awaitable, done at once: no object made per request. */
    self->entering = 1;
    return Py_NewRef(self);
}

/* `await` of what __aenter__ returned (the request itself): done at once, with the request;
   awaiting a request otherwise is a mistake (it was not entered). */
static PyObject *
request_await(Request *self)
{
    if (!self->entering) {
        PyErr_SetString(PyExc_TypeError,
                        "a Request is used with `async with prof.request(...)`, not awaited");
        return NULL;
    }
    return Py_NewRef(self);
}

static PySendResult
request_send(Request *self, PyObject *arg, PyObject **result)
{
    self->entering = 0;
    *result = Py_NewRef(self);
    return PYGEN_RETURN;
}

/* The iterator protocol's form of the same, which `await` uses while a trace function is
   set. */
static PyObject *
request_next(Request *self)
{
    if (!self->entering) {
        PyErr_SetString(PyExc_TypeError, "a Request is not an iterator");
        return NULL;
    }
    self->entering = 0;
    return stop_with((PyObject *)self);
}

static PyAsyncMethods request_async = {
    .am_await = (unaryfunc)request_await,
    .am_send = (sendfunc)request_send,
};

static PyObject *
request_aexit(Request *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_exit("__aexit__", nargs) < 0) {
        return NULL;
    }
    int64_t end = now_ns();
    /* The step's requests end: the gate keeps when the last one did (its rollout's end). */
    if (self->step == self->gate->step) {
        self->gate->last_ns = end;
    }
    if (self->recorder != NULL) {
        PyObject *note = note_of(args[0]);
        if (note == NULL) {
            return NULL;
        }
        int done = request_end(self, end, note);
        Py_DECREF(note);
        if (done < 0) {
            return NULL;
        }
    }
    return Py_NewRef(ready_none);
}

static PyObject *
request_end_method(Request *self, PyObject *const *args, Py_ssize_t nargs)
{
    int64_t end;
    if (check_end(nargs, args, &end) < 0 || request_end(self, end, args[1]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
request_forward(Request *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1) {
        PyErr_SetString(PyExc_TypeError, "forward(tokens=0) takes at most 1 argument");
        return NULL;
    }
    if (nkw == 1) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, 0);
        /* Keyword names in calls are interned, so the identity is the usual match. */
        int other = kw == str_tokens ? 0 : PyUnicode_Compare(kw, str_tokens);
        if (other != 0) {
            if (!PyErr_Occurred()) {
                PyErr_Format(
                    PyExc_TypeError, "forward() got an unexpected keyword argument %R", kw);
            }
            return NULL;
        }
    }
    if (nargs + nkw == 1) {
        PyObject *tokens = args[0];
        if (!PyLong_Check(tokens)) {
            PyErr_Format(PyExc_TypeError, "forward() tokens must be an int, not %.200s",
                         Py_TYPE(tokens)->tp_name);
            return NULL;
        }
        long long n = PyLong_AsLongLong(tokens);
        if (n == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if ((n > 0 && self->tokens > LLONG_MAX - n) || (n < 0 && self->tokens < LLONG_MIN - n)) {
            PyErr_SetString(PyExc_OverflowError, "forward() tokens add up beyond 64 bits");
            return NULL;
        }
        self->tokens += n;
    }
    Py_RETURN_NONE;
}

static PyObject *
request_get_prompt_tokens(Request *self, void *closure)
{
    return PyLong_FromLongLong(self->prompt_tokens);
}

/* `value` as a count for the attribute `name`: an int (no bool), >= 0, of 64 bits; -1 with
   the error set otherwise (`kinds`: what the attribute takes, for the TypeError). */
static long long
count_of(PyObject *value, const char *name, const char *kinds)
{
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be %s, not %.200s", name, kinds,
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    int overflow;
    long long n = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (n == -1 && PyErr_Occurred()) {
        return -1;
    }
    /* Beyond 64 bits, n is -1 and overflow says which way. */
    if (overflow > 0) {
        PyErr_Format(PyExc_OverflowError, "%s must fit in 64 bits", name);
        return -1;
    }
    if (overflow < 0 || n < 0) {
        PyErr_Format(PyExc_ValueError, "%s must be >= 0", name);
        return -1;
    }
    return n;
}

/* `req.prompt_tokens = n`: a count; the last one set counts. */
static int
request_set_prompt_tokens(Request *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete prompt_tokens");
        return -1;
    }
    long long n = count_of(value, "prompt_tokens", "an int");
    if (n < 0) {
        return -1;
    }
    self->prompt_tokens = n;
    return 0;
}

static PyObject *
request_get_trajectory(Request *self, void *closure)
{
    return Py_NewRef(self->trajectory);
}

/* `req.trajectory = t`: a str (of a subclass, kept as a plain str) of at most M_TRAJECTORY
   characters, or None; the last one set counts. */
static int
request_set_trajectory(Request *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete trajectory");
        return -1;
    }
    if (value != Py_None && !PyUnicode_Check(value)) {
        PyErr_Format(PyExc_TypeError, "trajectory must be a str or None, not %.200s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    /* A subclass's own characters, whatever it overrides: no code of its runs. */
    PyObject *text = value == Py_None ? Py_NewRef(value) : PyUnicode_FromObject(value);
    if (text == NULL) {
        return -1;
    }
    if (text != Py_None && PyUnicode_GET_LENGTH(text) > M_TRAJECTORY) {
        Py_DECREF(text);
        PyErr_Format(PyExc_ValueError, "trajectory must be at most %d characters",
                     M_TRAJECTORY);
        return -1;
    }
    Py_SETREF(self->trajectory, text);
    return 0;
}

static PyObject *
request_get_turn(Request *self, void *closure)
{
    if (self->turn < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong(self->turn);
}

/* `req.turn = n`: a count, or None; the last one set counts. */
static int
request_set_turn(Request *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete turn");
        return -1;
    }
    long long n = value == Py_None ? -1 : count_of(value, "turn", "an int or None");
    if (n < 0 && value != Py_None) {
        return -1;
    }
    self->turn = n;
    return 0;
}

/* -- traceparent: W3C trace context ---------------------------------------------------- */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
#define TRACEPARENT_LEN 55 /* "00-" trace id (32) "-" span id (16) "-01" */

/* The 64-bit FNV-1a hash of `n` bytes; 1 where that is 0 (a span id is never all zero). */
static uint64_t
fnv1a(const unsigned char *bytes, Py_ssize_t n)
{
    uint64_t h = FNV_OFFSET;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = (h ^ bytes[i]) * FNV_PRIME;
    }
    return h == 0 ? 1 : h;
}

/* The span id of a request id (a str, of a subclass too: its own characters): the FNV-1a
   hash of its UTF-8 bytes, lone surrogates as the timeline writes them. 0 with an error set
   on failure. */
static uint64_t
span_of_str(PyObject *text)
{
    if (PyUnicode_IS_ASCII(text)) {
        return fnv1a(PyUnicode_1BYTE_DATA(text), PyUnicode_GET_LENGTH(text));
    }
    PyObject *utf8 = PyUnicode_AsEncodedString(text, "utf8", "surrogatepass");
    if (utf8 == NULL) {
        return 0;
    }
    uint64_t h = fnv1a((const unsigned char *)PyBytes_AS_STRING(utf8), PyBytes_GET_SIZE(utf8));
    Py_DECREF(utf8);
    return h;
}

/* 16 lowercase hex digits of `v` at `out`. */
static void
put_hex16(char *out, uint64_t v)
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) {
        out[i] = digits[v & 0xf];
        v >>= 4;
    }
}

static PyObject *
request_get_traceparent(Request *self, void *closure)
{
    Gate *gate = self->gate;
    PyObject *salt = gate->trace_salt;
    if (salt == Py_None) {
        Py_RETURN_NONE;
    }
    /* The step the request entered in; before it entered, the gate's now. */
    PyObject *step = self->begin != 0 ? self->step : gate->step;
    uint64_t step_bits = UINT64_MAX; /* None: outside any step */
    if (step != NULL && step != Py_None) {
        if (!PyLong_Check(step)) {
            PyErr_Format(PyExc_TypeError, "a request's step must be an int or None, not %.200s",
                         Py_TYPE(step)->tp_name);
            return NULL;
        }
        /* Modulo 2**64; an int subclass's own value, no code of its runs. */
        step_bits = (uint64_t)PyLong_AsUnsignedLongLongMask(step);
        if (step_bits == UINT64_MAX && PyErr_Occurred()) {
            return NULL;
        }
    }
    uint64_t span;
    if (PyUnicode_Check(self->request_id)) {
        span = span_of_str(self->request_id);
        if (span == 0) {
            return NULL;
        }
    }
    else { /* no request id: the request's address, distinct for each live one */
        unsigned char address[8];
        uint64_t a = (uint64_t)(uintptr_t)self;
        for (int i = 0; i < 8; i++) {
            address[i] = (unsigned char)(a >> (8 * i));
        }
        span = fnv1a(address, 8);
    }
    char out[TRACEPARENT_LEN];
    memcpy(out, "00-", 3);
    memcpy(out + 3, PyUnicode_1BYTE_DATA(salt), 16);
    put_hex16(out + 19, step_bits);
    out[35] = '-';
    put_hex16(out + 36, span);
    memcpy(out + 52, "-01", 3);
    return PyUnicode_FromStringAndSize(out, TRACEPARENT_LEN);
}

/* The values of the first replicas, made once: formatting one costs more than the traceparent. */
#define TRACESTATE_CACHED 256
static PyObject *tracestate_cache[TRACESTATE_CACHED];

/* The request's replica in a W3C tracestate member, which the servers' spans of it carry back:
   "aprof=r<replica>" for a replica that is an int from 0 to 2**63 - 1. */
static PyObject *
request_get_tracestate(Request *self, void *closure)
{
    if (self->gate->trace_salt == Py_None || !PyLong_Check(self->replica)) {
        Py_RETURN_NONE;
    }
    int overflow = 0;
    long long replica = PyLong_AsLongLongAndOverflow(self->replica, &overflow);
    if (replica == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (overflow != 0 || replica < 0) {
        Py_RETURN_NONE;
    }
    if (replica >= TRACESTATE_CACHED) {
        return PyUnicode_FromFormat("aprof=r%lld", replica);
    }
    if (tracestate_cache[replica] == NULL) {
        tracestate_cache[replica] = PyUnicode_FromFormat("aprof=r%lld", replica);
        if (tracestate_cache[replica] == NULL) {
            return NULL;
        }
    }
    return Py_NewRef(tracestate_cache[replica]);
}

/* span_id_of(request_id): the span id a request with this id has in its traceparent. */
static PyObject *
span_id_of(PyObject *module, PyObject *request_id)
{
    if (!PyUnicode_Check(request_id)) {
        PyErr_Format(PyExc_TypeError, "span_id_of() request_id must be a str, not %.200s",
                     Py_TYPE(request_id)->tp_name);
        return NULL;
    }
    uint64_t span = span_of_str(request_id);
    if (span == 0) {
        return NULL;
    }
    char out[16];
    put_hex16(out, span);
    return PyUnicode_FromStringAndSize(out, 16);
}

static PyObject *
request_repr(Request *self)
{
    return PyUnicode_FromFormat("Request(replica=%R, request_id=%R, step=%R, gated=%s, "
                                "captured=%s)",
                                self->replica, self->request_id, self->step,
                                self->gated ? "True" : "False",
                                self->captured ? "True" : "False");
}

static PyMethodDef request_methods[] = {
    {"__aenter__", (PyCFunction)request_aenter, METH_NOARGS,
     "Take the current step and let the request go, after its replica's capture has "
     "started if it is starting."},
    {"__aexit__", (PyCFunction)(void (*)(void))request_aexit, METH_FASTCALL,
     "Record the request; noted with the exception's type name if one is raised."},
    {"_end", (PyCFunction)(void (*)(void))request_end_method, METH_FASTCALL,
     "_end(end, note): record the request as ended at `end` (monotonic ns) with `note`, "
     "unless it ended already."},
    {"forward", (PyCFunction)(void (*)(void))request_forward, METH_FASTCALL | METH_KEYWORDS,
     "forward(tokens=0): report progress of the request; reported tokens add up."},
    {NULL},
};

static PyMemberDef request_members[] = {
    {"replica", T_OBJECT, offsetof(Request, replica), READONLY,
     "The replica the request goes to."},
    {"request_id", T_OBJECT, offsetof(Request, request_id), READONLY,
     "The caller's identifier for the request, if any."},
    {"step", T_OBJECT, offsetof(Request, step), READONLY,
     "The global step the request was admitted in (None outside any step)."},
    {"gated", T_BOOL, offsetof(Request, gated), 0,
     "The request waited for its replica's capture to start."},
    {"captured", T_BOOL, offsetof(Request, captured), 0,
     "A capture of its replica was active when the request went ahead."},
    {"tokens", T_LONGLONG, offsetof(Request, tokens), READONLY,
     "Tokens reported through forward()."},
    {NULL},
};

static PyGetSetDef request_getset[] = {
    {"prompt_tokens", (getter)request_get_prompt_tokens, (setter)request_set_prompt_tokens,
     "The request's prompt, in tokens, when the client knows it (0: not known).", NULL},
    {"trajectory", (getter)request_get_trajectory, (setter)request_set_trajectory,
     "The trajectory (agent-loop run) the request is a turn of, when the client knows it.",
     NULL},
    {"turn", (getter)request_get_turn, (setter)request_set_turn,
     "Which turn of its trajectory the request is (0: the first), when the client knows it.",
     NULL},
    {"traceparent", (getter)request_get_traceparent, NULL,
     "The request's W3C trace context, as a ``traceparent`` header value: one trace per step "
     "of the run,\nthe request's own span id; None when the profiler gives none (its gate has "
     "no trace_salt).\n\n"
     "The trace id is the gate's trace_salt and the step (the request's once it entered, the "
     "gate's\nbefore; ffffffffffffffff for none) in 16 hex digits; the span id is span_id_of "
     "the request id,\nor of the request's address without one.",
     NULL},
    {"tracestate", (getter)request_get_tracestate, NULL,
     "The request's replica as a W3C ``tracestate`` header value (``aprof=r<replica>``), sent "
     "with\nits traceparent: the servers' spans of it carry it back. None when the profiler "
     "gives no trace\ncontext or the replica is not an int from 0 to 2**63 - 1.",
     NULL},
    {NULL},
};

static PyTypeObject Request_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof.Request",
    .tp_basicsize = sizeof(Request),
    .tp_dealloc = (destructor)request_dealloc,
    .tp_repr = (reprfunc)request_repr,
    .tp_as_async = &request_async,
    .tp_iternext = (iternextfunc)request_next,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "One agent-loop request to a replica, as an async context manager and its own "
        "handle.\n\n"
        "``async with prof.request(replica=0, request_id=\"s3-t1\") as req:`` waits while the\n"
        "replica's capture for the current step is starting (bounded by the start timeout),\n"
        "then lets the request go; ``req.step``, ``req.gated`` and ``req.captured`` say what\n"
        "happened. The request is one timeline span, recorded when it ends.",
    .tp_methods = request_methods,
    .tp_members = request_members,
    .tp_getset = request_getset,
    .tp_new = request_new,
    .tp_vectorcall = request_vectorcall,
};

/* -- requests: what `prof.request` is ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    PyObject *gate;
    PyObject *recorder; /* None while the timeline is off */
    vectorcallfunc vectorcall;
} Requests;

static PyTypeObject Requests_Type;

static PyObject *str_replica;
static PyObject *str_request_id;

/* Whether the keyword `kw` is `name` (interned: identity is the usual match); -1 on error. */
static int
is_keyword(PyObject *kw, PyObject *name)
{
    if (kw == name) {
        return 1;
    }
    int other = PyUnicode_Compare(kw, name);
    return other == -1 && PyErr_Occurred() ? -1 : other == 0;
}

/* `prof.request(replica=r, request_id=None)`: a Request through the gate into the recorder. */
static PyObject *
requests_call(Requests *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs > 0) {
        PyErr_Format(PyExc_TypeError, "request() takes 0 positional arguments but %zd %s given",
                     nargs, nargs == 1 ? "was" : "were");
        return NULL;
    }
    PyObject *replica = NULL, *request_id = Py_None;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, i);
        int found = is_keyword(kw, str_replica);
        if (found == 1) {
            replica = args[i];
            continue;
        }
        found = found < 0 ? -1 : is_keyword(kw, str_request_id);
        if (found == 1) {
            request_id = args[i];
            continue;
        }
        if (found == 0) {
            PyErr_Format(PyExc_TypeError, "request() got an unexpected keyword argument %R", kw);
        }
        return NULL;
    }
    if (replica == NULL) {
        PyErr_SetString(PyExc_TypeError,
                        "request() missing 1 required keyword-only argument: 'replica'");
        return NULL;
    }
    return request_make(self->gate, self->recorder, replica, request_id);
}

static PyObject *
requests_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    PyObject *gate, *recorder;
    if (kwargs != NULL && PyDict_GET_SIZE(kwargs) > 0) {
        PyErr_SetString(PyExc_TypeError, "requests() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_UnpackTuple(args, "requests", 2, 2, &gate, &recorder)) {
        return NULL;
    }
    if (Py_TYPE(gate) != &Gate_Type) {
        PyErr_Format(PyExc_TypeError, "expected a Gate, not %.200s", Py_TYPE(gate)->tp_name);
        return NULL;
    }
    if (recorder != Py_None && check_recorder(recorder) < 0) {
        return NULL;
    }
    Requests *self = (Requests *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->gate = Py_NewRef(gate);
    self->recorder = Py_NewRef(recorder);
    self->vectorcall = (vectorcallfunc)requests_call;
    return (PyObject *)self;
}

static int
requests_traverse(Requests *self, visitproc visit, void *arg)
{
    Py_VISIT(self->gate);
    Py_VISIT(self->recorder);
    return 0;
}

static int
requests_clear(Requests *self)
{
    Py_CLEAR(self->gate);
    Py_CLEAR(self->recorder);
    return 0;
}

static void
requests_dealloc(Requests *self)
{
    PyObject_GC_UnTrack(self);
    requests_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject Requests_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "aprof._timeline._recorder.requests",
    .tp_basicsize = sizeof(Requests),
    .tp_dealloc = (destructor)requests_dealloc,
    .tp_vectorcall_offset = offsetof(Requests, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "requests(gate, recorder): what prof.request is; calling it with replica=r, "
              "request_id=None\nmakes the Request of one request to replica r, through gate, "
              "into recorder (None: the\ntimeline is off).",
    .tp_traverse = (traverseproc)requests_traverse,
    .tp_clear = (inquiry)requests_clear,
    .tp_new = requests_new,
};

/* -- the module ------------------------------------------------------------------------ */

static PyMethodDef recorder_functions[] = {
    {"span_id_of", (PyCFunction)span_id_of, METH_O,
     "span_id_of(request_id) -> str: the span id, 16 lowercase hex digits, of the request with "
     "this id\nin its traceparent: the 64-bit FNV-1a hash of its UTF-8 bytes (1 where that is "
     "0)."},
    {NULL},
};

static struct PyModuleDef recorder_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "aprof._timeline._recorder",
    .m_doc = "The timeline's hot path in C: Gate, Tally, Recorder, Span, Request, requests, "
             "NULL_SPAN\nand span_id_of (pyrecorder.py is its twin).",
    .m_size = -1,
    .m_methods = recorder_functions,
};

static int
intern(PyObject **name, const char *text)
{
    *name = PyUnicode_InternFromString(text);
    return *name == NULL ? -1 : 0;
}

PyMODINIT_FUNC
PyInit__recorder(void)
{
    if (intern(&str_tokens, "tokens") < 0 || intern(&str_replica, "replica") < 0 ||
        intern(&str_request_id, "request_id") < 0) {
        return NULL;
    }
    if (PyType_Ready(&Ready_Type) < 0 || PyType_Ready(&Tally_Type) < 0 ||
        PyType_Ready(&Gate_Type) < 0 ||
        PyType_Ready(&Recorder_Type) < 0 ||
        PyType_Ready(&Span_Type) < 0 || PyType_Ready(&Request_Type) < 0 ||
        PyType_Ready(&Requests_Type) < 0 ||
        PyType_Ready(&NullSpan_Type) < 0) {
        return NULL;
    }
    ready_none = ready_new(Py_None);
    null_ready = ready_new((PyObject *)&null_span);
    if (ready_none == NULL || null_ready == NULL) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&recorder_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Tally", (PyObject *)&Tally_Type) < 0 ||
        PyModule_AddObjectRef(module, "Gate", (PyObject *)&Gate_Type) < 0 ||
        PyModule_AddObjectRef(module, "Recorder", (PyObject *)&Recorder_Type) < 0 ||
        PyModule_AddObjectRef(module, "Span", (PyObject *)&Span_Type) < 0 ||
        PyModule_AddObjectRef(module, "Request", (PyObject *)&Request_Type) < 0 ||
        PyModule_AddObjectRef(module, "requests", (PyObject *)&Requests_Type) < 0 ||
        PyModule_AddObjectRef(module, "NullSpan", (PyObject *)&NullSpan_Type) < 0 ||
        PyModule_AddObjectRef(module, "NULL_SPAN", (PyObject *)&null_span) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
