"""Webhook body templates: jinja2 syntax ({{ title }}) in a sandbox, rendered
on a budget.

In a JSON body (the default), every value is escaped for use inside a JSON
string, so `{"text": "{{ content }}"}` stays valid JSON whatever the content
holds.  Variables: event_type, title, content, user, key_name, balance,
threshold, time.

Any signed-in user writes these templates, so a template must not be able
to stall the server.  The budget:
- the source: at most MAX_SOURCE characters and MAX_TAGS tags;
- loops: MAX_LOOPS turns of all its `for` loops together (and of filters
  that iterate, such as join), no recursive loops; MAX_OPS calls, operators,
  filters and output pieces;
- size: no value or output over MAX_OUTPUT characters, checked before an
  operator or method builds it (`"x" * 10**9`, `"x".center(10**9)`,
  `9 ** 9 ** 9` never run); only filters that cannot blow up are offered;
- time: MAX_CPU_SECONDS of the rendering thread's CPU.
Over budget is a ValueError naming the limit: a 400 at save and preview
time, a permanent delivery failure at send time.

Compiling and rendering are pure Python and can still take tens of
milliseconds, so the event loop hands them to one worker thread (`run`):
the interpreter lets the loop thread back in every few milliseconds, and
the budget bounds the worker's total.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import wraps
from json.encoder import encode_basestring as _encode_string

from cachetools import LRUCache
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.filters import FILTERS
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError, safe_range
from jinja2.visitor import NodeTransformer

VARIABLES = ("event_type", "title", "content", "user", "key_name", "balance", "threshold", "time")

DEFAULT_TEMPLATE = ('{"event_type": "{{ event_type }}", "title": "{{ title }}", '
                    '"content": "{{ content }}", "user": "{{ user }}", "key_name": "{{ key_name }}", '
                    '"balance": "{{ balance }}", "threshold": "{{ threshold }}", "time": "{{ time }}"}')

MAX_SOURCE = 10_000
MAX_TAGS = 200
MAX_LOOPS = 20_000
MAX_OPS = 100_000
MAX_OUTPUT = 100_000
MAX_CPU_SECONDS = 0.05
# Variables as long as real ones get (announcements are up to 20,000
# characters), so that a template that only blows up on real data is refused
# at save time, not at the first delivery.
_CHECK_VARS = {"event_type": "user_quota_warning", "title": "T" * 200, "content": "C\n" * 10_000,
               "user": "u" * 64, "key_name": "k" * 64, "balance": 123456789,
               "threshold": 1000000, "time": "2026-01-01 00:00:00 UTC"}

# Filters that cannot build something much larger than their input; the
# rest (center, indent, wordwrap, format, batch, slice, urlize, random, ...)
# are not offered.
SAFE_FILTERS = ("abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape",
                "filesizeformat", "first", "float", "forceescape", "groupby", "int", "items",
                "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
                "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
                "sort", "string", "striptags", "sum", "title", "tojson", "trim", "truncate",
                "unique", "upper", "urlencode", "wordcount", "xmlattr")
# Methods a template may call on a string (none of them pads or repeats).
SAFE_STR_METHODS = frozenset((
    "capitalize", "casefold", "count", "endswith", "find", "index", "isalnum", "isalpha",
    "isdigit", "islower", "isnumeric", "isspace", "istitle", "isupper", "lower", "lstrip",
    "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rsplit", "rstrip", "split",
    "splitlines", "startswith", "strip", "swapcase", "title", "upper", "join"))
SAFE_NUMBER_METHODS = frozenset(("bit_length", "conjugate", "is_integer", "as_integer_ratio"))
# The largest number a filter takes besides its value (truncate, round, tojson's indent).
MAX_FILTER_ARG = 10_000


class OverBudget(ValueError):
    pass


class _Budget:
    __slots__ = ("loops", "ops", "start")

    def __init__(self):
        self.loops = MAX_LOOPS
        self.ops = MAX_OPS
        self.start = time.thread_time()

    def loop(self) -> None:
        self.loops -= 1
        if self.loops < 0:
            raise OverBudget(f"its loops run more than {MAX_LOOPS:,} times in all")
        self.spend()

    def spend(self) -> None:
        self.ops -= 1
        if self.ops < 0:
            raise OverBudget(f"it makes more than {MAX_OPS:,} calls and operations")
        if self.ops & 127 == 0:
            self.check_time()

    def check_time(self) -> None:
        if time.thread_time() - self.start > MAX_CPU_SECONDS:
            raise OverBudget(f"it takes more than {int(MAX_CPU_SECONDS * 1000)} ms to render")


_local = threading.local()


def _budget() -> _Budget:
    b = getattr(_local, "budget", None)
    if b is None:  # rendered outside render() (not expected): a fresh budget
        b = _local.budget = _Budget()
    return b


def _sized(value):
    if type(value) is str:  # nearly every value: the one check it needs
        if len(value) > MAX_OUTPUT:
            raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
        return value
    if isinstance(value, (str, list, tuple, dict, set, frozenset)) and len(value) > MAX_OUTPUT:
        raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4096:
        raise OverBudget("it builds a number with more than 4096 bits")
    return value


def _size_of(value) -> int:
    return len(value) if isinstance(value, (str, list, tuple)) else 1


class _Env(ImmutableSandboxedEnvironment):
    """The sandbox (no private attributes, no mutation of lists or dicts)
    plus a budget on everything that can loop or grow."""

    intercepted_binops = frozenset(("*", "**", "+", "%", "//"))

    def call_binop(self, context, operator, left, right):
        _budget().spend()
        if operator == "**":
            if isinstance(right, (int, float)) and isinstance(left, (int, float)) and \
                    abs(right) * max(1, abs(int(left)).bit_length()) > 4096:
                raise OverBudget("it raises a number to too high a power")
        elif operator == "*":
            if isinstance(left, int) and isinstance(right, int):
                if left.bit_length() + right.bit_length() > 4096:
                    raise OverBudget("it builds a number with more than 4096 bits")
            elif isinstance(left, (str, list, tuple)) or isinstance(right, (str, list, tuple)):
                times = right if isinstance(left, (str, list, tuple)) else left
                seq = left if isinstance(left, (str, list, tuple)) else right
                if isinstance(times, int) and len(seq) * max(times, 0) > MAX_OUTPUT:
                    raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
        elif operator == "+":
            if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)) \
                    and len(left) + len(right) > MAX_OUTPUT:
                raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
        elif operator == "%" and isinstance(left, str):
            raise SecurityError("'%' formatting of strings is not available; use ~ or filters")
        return _sized(super().call_binop(context, operator, left, right))

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 - jinja's signature
        _budget().spend()
        owner = getattr(__obj, "__self__", None)
        name = getattr(__obj, "__name__", "")
        if isinstance(owner, str) and name not in SAFE_STR_METHODS:
            raise SecurityError(f"the string method {name!r} is not available")
        if isinstance(owner, (int, float)) and name not in SAFE_NUMBER_METHODS:
            raise SecurityError(f"the number method {name!r} is not available")
        if isinstance(owner, str) and __obj.__name__ == "replace" and len(args) >= 2 and \
                isinstance(args[0], str) and isinstance(args[1], str):
            _replace_fits(owner, args[0], args[1])
        if isinstance(owner, str) and __obj.__name__ == "join" and args:
            args = (list(_counted(args[0])),) + args[1:]
            if sum(_size_of(x) for x in args[0]) + len(owner) * len(args[0]) > MAX_OUTPUT:
                raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
        return _sized(super().call(__context, __obj, *args, **kwargs))

    def budget_iter(self, iterable):
        """Wraps the iterable of every `for` in the template."""
        return _counted(iterable)

    def budget_concat(self, *parts):
        """The `~` operator."""
        _budget().spend()
        out = "".join(str(p) for p in parts)
        return _sized(out)

    def _parse(self, source, name, filename):
        return _Metered().visit(super()._parse(source, name, filename))


class _Metered(NodeTransformer):
    """Rewrites the parsed template: every `for` iterates through
    budget_iter, every `~` is a call of budget_concat."""

    def visit_For(self, node):
        self.generic_visit(node)
        if node.recursive:
            raise SecurityError("recursive loops are not available in notification templates")
        node.iter = nodes.Call(nodes.EnvironmentAttribute("budget_iter"), [node.iter], [],
                               None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node):
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute("budget_concat"), node.nodes, [], None,
                          None, lineno=node.lineno)


def _counted(iterable):
    budget = _budget()
    for item in iterable:
        budget.loop()
        yield item


def _replace_fits(s: str, old: str, new: str) -> None:
    grow = (len(new) - len(old)) * (s.count(old) if old else len(s) + 1)
    if len(s) + grow > MAX_OUTPUT:
        raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")


def _budget_range(*args):
    r = safe_range(*args)
    if len(r) > MAX_LOOPS:
        raise OverBudget(f"range() of {len(r):,} items is more than its loops may run")
    return r


def _guard_filter(name, fn):
    # A filter is called as fn(value, ...) or, when it asks for a context or
    # an environment, fn(that, value, ...).
    first = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0
    # join measures what it builds even with no arguments; the rest, given
    # only the value, have nothing more to check.
    plain = name != "join"

    @wraps(fn)
    def guarded(*args, **kwargs):
        _budget().spend()
        if plain and len(args) == first + 1 and not kwargs:  # the value alone (`x|upper`)
            return _sized(fn(*args))
        for a in (*args[first + 1:], *kwargs.values()):
            if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MAX_FILTER_ARG:
                raise OverBudget(f"it passes a number over {MAX_FILTER_ARG:,} to '{name}'")
        if name == "replace" and len(args) >= first + 3 and \
                all(isinstance(a, str) for a in args[first:first + 3]):
            _replace_fits(*args[first:first + 3])
        if name == "join" and len(args) > first:
            items = list(_counted(args[first]))
            sep = args[first + 1] if len(args) > first + 1 else kwargs.get("d", "")
            if sum(len(str(x)) for x in items) + len(str(sep)) * len(items) > MAX_OUTPUT:
                raise OverBudget(f"it builds a value longer than {MAX_OUTPUT:,} characters")
            args = (*args[:first], items, *args[first + 1:])
        return _sized(fn(*args, **kwargs))
    return guarded


def _json_inner(value) -> str:
    # json.dumps(s, ensure_ascii=False) without its per-call Python overhead:
    # a template looping over 10,000 lines calls this once a line.
    return _encode_string("" if value is None else str(value))[1:-1]


def _finalize(escape):
    def finalize(value):
        _budget().spend()
        return _sized(escape(value) if escape else value)
    return finalize


def _make_env(json_mode: bool) -> _Env:
    env = _Env(undefined=StrictUndefined, autoescape=False,
               finalize=_finalize(_json_inner if json_mode else None))
    env.filters = {name: _guard_filter(name, FILTERS[name]) for name in SAFE_FILTERS}
    env.globals = {"range": _budget_range, "dict": dict,
                   "namespace": env.globals["namespace"], "cycler": env.globals["cycler"],
                   "joiner": env.globals["joiner"]}
    return env


_plain = _make_env(False)
_json = _make_env(True)
_compiled: LRUCache = LRUCache(maxsize=512)
_lock = threading.Lock()


def _template(source: str, json_mode: bool):
    key = (source, json_mode)
    with _lock:
        hit = _compiled.get(key)
    if hit is None:
        if len(source) > MAX_SOURCE:
            raise OverBudget(f"it is longer than {MAX_SOURCE:,} characters")
        tags = source.count("{{") + source.count("{%") + source.count("{#")
        if tags > MAX_TAGS:
            raise OverBudget(f"it has more than {MAX_TAGS} tags")
        hit = (_json if json_mode else _plain).from_string(source)
        with _lock:
            _compiled[key] = hit
    return hit


def render(template: str, variables: dict, json_mode: bool = True) -> str:
    """Render; raise ValueError naming the problem (syntax, unknown variable,
    over budget).  It blocks, so it refuses to run on the event loop's
    thread: from there, call it through run()."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError("templates.render() would block the event loop; "
                           "await templates.run(...) instead")
    _local.budget = budget = _Budget()
    try:
        tpl = _template(template or DEFAULT_TEMPLATE, json_mode)
        budget.start = time.thread_time()  # compiling is bounded by the source limits
        out: list[str] = []
        size = 0
        for piece in tpl.generate({k: variables.get(k, "") for k in VARIABLES}):
            size += len(piece)
            if size > MAX_OUTPUT:
                raise OverBudget(f"it writes more than {MAX_OUTPUT:,} characters")
            out.append(piece)
            # Pieces that compute (expressions, loops, filters) spend from the
            # budget, which reads the clock every 128; a literal piece costs
            # little, and the clock is a system call (about 1 us here).
            if len(out) & 127 == 0:
                budget.check_time()
        return "".join(out)
    except OverBudget as exc:
        raise ValueError(f"The body template is over its budget: {exc}. Simplify it.") from None
    except (TemplateError, SecurityError) as exc:
        raise ValueError(f"The body template does not render: {exc}") from None
    except RecursionError:
        raise ValueError("The body template does not render: it nests or recurses too "
                         "deeply.") from None
    except (ArithmeticError, TypeError, ValueError, LookupError, AttributeError,
            SyntaxError, MemoryError) as exc:
        raise ValueError(f"The body template does not render: {type(exc).__name__}: "
                         f"{str(exc)[:200]}") from None
    finally:
        _local.budget = None


def check(template: str) -> None:
    """Raise ValueError unless the template renders within budget, with
    empty variables and with variables as long as real ones get."""
    render(template, {k: "" for k in VARIABLES}, json_mode=False)
    render(template, _CHECK_VARS, json_mode=True)


_worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="templates")
# While the template thread works, the interpreter hands the lock back to the
# event loop's thread this often (the default is every 5 ms).
_SWITCH_INTERVAL = 0.0005


def _on_worker(fn, args):
    before = sys.getswitchinterval()
    sys.setswitchinterval(min(before, _SWITCH_INTERVAL))
    try:
        return fn(*args)
    finally:
        sys.setswitchinterval(before)


async def run(fn, *args):
    """fn(*args) (anything that compiles or renders templates) on the
    template thread, so that the event loop stays free meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_worker, _on_worker, fn, args)
