"""Where request bytes become values: the one JSON parser for every route
family (the relay faces through relay/faces/openai.load_json, /api through
ApiHandler.body_json).  The typed checks for single values (JSON fields and
query parameters alike) are in relay/serving/values.py.

What it refuses, each with a BadInput naming the field:
- bytes that are not UTF-8 (raw ED A0 80, an encoded surrogate, is not);
- lone surrogates written as escapes ("\\ud800"): they cannot be stored,
  hashed or sent on; a proper pair ("\\ud83d\\ude00") is one character;
- NaN, Infinity, numbers that overflow a double, and integers outside the
  signed 64-bit range (what MongoDB and every vendor API can hold);
- nesting deeper than MAX_DEPTH: deep enough for real JSON schemas in
  tools, and shallow enough that no code after us (converters, tokenizer,
  the BSON encoder, which refuses 100 levels) ever meets a RecursionError.

Cost on the hot path: orjson's strict decode and one compact encoding,
which checks the depth (the document goes in nested in lists, so that
orjson's own limit on nesting is met one level past MAX_DEPTH) and the
numbers (see _large_float), and which a pass-through face then compares
with the client's bytes (parse_passing).  The walk over every
value, which names the field, runs only when one of them says it will find
something (deep nesting, a surrogate escape, a refused number).
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

# BadInput and the single-value checks live in relay/serving/values.py; the
# names stay here for the callers that read them as jsonin.whole, ...
from relay.serving.json_paths import deep as _deep, name as _name, too_deep as _too_deep
from relay.serving.values import (INT64_MAX, INT64_MIN, BadInput, flag, lone,  # noqa: F401
                                  number, relay_error, text, whole)

try:  # several times json's speed on the hot path; json does it all without
    import orjson
except ImportError:  # pragma: no cover
    orjson = None

MAX_DEPTH = 64

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")
# Where the json module must read what orjson would not read alike (the
# slow path's hooks, an upstream's answer): an
# integer of 19 digits or more, an exponent of three digits (e+308 is past
# a float), a run of 300 digits.  Looked for in the body's shape: digits
# read as 0, e and E as e, + as itself, all else as a space.  One pass of
# bytes.translate and a few substring searches: a regex such as \d{19}
# tries every position, 3 us for a short request and 60 us for 6 KB.
_SHAPES = bytes(48 if chr(c).isdigit() and c < 128 else 101 if c in b"eE"
                else 43 if c == 43 else 32 for c in range(256))
_LONG_RUN = b"0" * 19
_FLOAT_RUN = b"0" * 300


def _long_int(shape: bytes) -> bool:
    return _LONG_RUN in shape


def _big_float(shape: bytes) -> bool:
    return b"e000" in shape or b"e+000" in shape or _FLOAT_RUN in shape


def _surrogate_escape(data: bytes) -> bool:
    return b"\\u" in data and _SURROGATE_ESCAPE.search(data) is not None



class _Refused:
    """Stands in for a number the parser refused, until the walk names it."""
    __slots__ = ("why",)

    def __init__(self, why: str):
        self.why = why


def _constant(name: str) -> _Refused:
    return _Refused(f"is {name}, which JSON does not allow")


def _int(text: str):
    value = int(text)
    if INT64_MIN <= value <= INT64_MAX:
        return value
    return _Refused("is an integer outside the signed 64-bit range")


def _float(text: str):
    value = float(text)
    return value if math.isfinite(value) else _Refused("is a number too large to hold")


def parse(raw: bytes | str, what: str = "The request body", max_depth: int = MAX_DEPTH) -> Any:
    """JSON text -> value, or BadInput saying what is wrong and where."""
    doc, _ = _fast(raw, max_depth)
    return doc if doc is not _SLOW else _slow(raw, what, max_depth)


def parse_passing(raw: bytes, what: str = "The request body") -> tuple[dict, bytes]:
    """parse_object(), and the bytes a pass-through face sends upstream for
    this body (passed_on): the parse's own compact encoding serves both."""
    doc, compact = _fast(raw, MAX_DEPTH)
    if doc is _SLOW:
        doc = _slow(raw, what, MAX_DEPTH)
    return _object(doc, what), passed_on(raw, doc, compact)


_SLOW = object()
# A body shorter than this has its containers walked for the depth: the
# lists that _encoded_within nests a document in cost more than that walk.
_WALK_BELOW = 4096


def _deepest_written() -> int:
    """How many containers deep orjson writes a document (254: past that
    it raises "Recursion limit reached"), or 0 when this orjson does not
    behave so, and _fast walks the containers instead."""
    if orjson is None:
        return 0
    try:
        orjson.dumps(_nested(0, 254))
    except TypeError:
        return 0
    try:
        orjson.dumps(_nested(0, 255))
    except TypeError:
        return 254
    return 0


def _nested(doc, lists: int):
    """doc as the innermost of that many lists."""
    for _ in range(lists):
        doc = [doc]
    return doc


_DEEPEST_WRITTEN = _deepest_written()


def _fast(raw, max_depth: int):
    """(orjson's document, its compact encoding or None), or (_SLOW, None)
    when the json module must read the body: orjson refused it (the slow
    path says what is wrong, and where), it nests too deep, or it may hold
    an integer past the signed 64 bits, which orjson reads otherwise than
    json (see _large_float)."""
    if orjson is None or not isinstance(raw, bytes):
        return _SLOW, None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _SLOW, None
    compact = _encoded_within(doc, max_depth) if len(raw) >= _WALK_BELOW else None
    if compact is None:
        # A short body; or one too deep, with an integer past 53 bits, or
        # with what orjson will not write: the walks say which.
        if not _within(doc, max_depth):
            return _SLOW, None
        compact = _dumps_strict(doc)
    if (compact is None or _large_float(compact)) and not _numbers_exact(doc):
        return _SLOW, None
    return doc, compact


def _encoded_within(doc, max_depth: int) -> bytes | None:
    """orjson's compact encoding of doc when doc nests no deeper than
    max_depth and holds no integer past 53 bits, else None (either or
    neither).  One encoding checks the depth as well: doc goes in as the
    innermost of enough lists that orjson's own limit on nesting falls
    one level past max_depth.  A walk of an agent's 500 and more
    containers cost more than orjson's parse, and the indented encoding
    searched for a line that deep as much as this whole encoding."""
    wrap = _DEEPEST_WRITTEN - max_depth
    if wrap <= 0:
        return None
    if max_depth != MAX_DEPTH:
        return _unwrapped(_dumps_strict(_nested(doc, wrap)), wrap)
    # Making and freeing 190 lists cost half the encoding of a 100 KB body:
    # they are kept.  Each call takes a set of its own (pop and append are
    # atomic), so a body parsed off the loop never shares one.
    try:
        outer, inner = _WRAPS.pop()
    except IndexError:
        inner = [None]
        outer = _nested(inner, wrap - 1)
    inner[0] = doc
    try:
        return _unwrapped(_dumps_strict(outer), wrap)
    finally:
        inner[0] = None
        _WRAPS.append((outer, inner))


_WRAPS: list = []


def _dumps_strict(doc) -> bytes | None:
    try:
        return orjson.dumps(doc, option=orjson.OPT_STRICT_INTEGER)
    except TypeError:
        return None


def _unwrapped(out: bytes | None, wrap: int) -> bytes | None:
    return None if out is None else out[wrap:len(out) - wrap]


def _large_float(compact: bytes) -> bool:
    """Whether orjson's compact encoding of a document may hold a float of
    2**63 or more: orjson writes those with an exponent of 18 or more
    (9.3e+18, 1e+20), and no other value of the document writes `<digit>e+`
    outside a string.  What orjson reads otherwise than json is an integer
    past 64 bits (a float to orjson, and written so) or one between 2**63
    and 2**64 (an integer past 53 bits, which OPT_STRICT_INTEGER refuses):
    where neither may be, the walk of every number (_numbers_exact) is
    spared.  Text that reads `1e+20` only costs that walk."""
    # Found by its "+", which text holds far less often than "e" (a search
    # for "e+" stops at every e: 100 us for 100 KB, against 10).
    at = compact.find(b"+", 2)
    while at >= 0:
        if compact[at - 1] == 101 and 48 <= compact[at - 2] <= 57:
            end = at + 1
            while end < len(compact) and 48 <= compact[end] <= 57:
                end += 1
            if end > at + 1 and int(compact[at + 1:end]) >= 18:
                return True
        at = compact.find(b"+", at + 1)
    return False


def _slow(raw: bytes | str, what: str, max_depth: int) -> Any:
    """The json module's parse, which names what it refuses."""
    if isinstance(raw, str):
        text = raw
    else:
        if raw[:3] == b"\xef\xbb\xbf":
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(raw, exc, what, max_depth) from None
    if not text.strip():
        raise BadInput(f"{what} is empty; send a JSON object.")
    data = raw if isinstance(raw, bytes) else text.encode("utf-8", "surrogatepass")
    refused = []

    def constant(name):
        refused.append(1)
        return _constant(name)

    hooks: dict = {"parse_constant": constant}
    shape = data.translate(_SHAPES)
    if _long_int(shape):
        hooks["parse_int"] = lambda t: _note(refused, _int(t))
    if _big_float(shape):
        hooks["parse_float"] = lambda t: _note(refused, _float(t))
    try:
        doc = json.loads(text, **hooks)
    except RecursionError:
        raise _too_deep(text, what, max_depth) from None
    except ValueError as exc:
        raise BadInput(f"{what} is not valid JSON: {exc}.") from None
    deep = data.count(b"[") + data.count(b"{") > max_depth
    surrogates = _surrogate_escape(data)
    if deep or surrogates or refused:
        problem = _check(doc, max_depth if deep else 0, surrogates)
        if problem is not None:
            field, message = problem
            raise BadInput(message.replace("{what}", what), field or None)
    return doc


_CONTAINERS = (dict, list)


def _within(doc, max_depth: int) -> bool:
    """True when no container in doc is nested deeper than max_depth (doc
    itself is level 1).  Visits containers only, a level at a time: about
    what orjson took to parse the body, where the walk of every value that
    names the field too deep costs ten times that."""
    level = [doc]
    for _ in range(max_depth):
        below = []
        for v in level:
            if type(v) is dict:
                below.extend([x for x in v.values() if type(x) in _CONTAINERS])
            elif type(v) is list:
                below.extend([x for x in v if type(x) in _CONTAINERS])
        if not below:
            return True
        level = below
    return False


_INT64_FLOAT = float(2 ** 63)


def _numbers_exact(doc) -> bool:
    """True when no number in doc is one orjson may have read otherwise than
    json: an integer past the signed 64-bit range (orjson keeps up to 2**64,
    then makes a float) or a float that large (it may have been such an
    integer).  A float of 1e20 written as such goes the slow way too, which
    reads it the same."""
    stack = [[doc]]
    while stack:
        v = stack.pop()
        for x in (v.values() if type(v) is dict else v):
            t = type(x)
            if t is dict or t is list:
                stack.append(x)
            elif t is int:
                if not INT64_MIN <= x <= INT64_MAX:
                    return False
            elif t is float and abs(x) >= _INT64_FLOAT:
                return False
    return True


def dumps(value: Any, held: bool = True) -> bytes:
    """Compact UTF-8 JSON for a document we send.  `held`: the bytes outlive
    the call (an upstream request, kept for the whole stream); False when the
    caller copies them at once anyway (an SSE event joined to its frame)."""
    if orjson is not None:
        try:
            out = orjson.dumps(value)
        except TypeError:  # what orjson will not take (an int past 64 bits, a non-str key)
            pass
        else:
            # orjson's bytes keep the buffer it wrote them into (4 KB for a
            # short text, 32 KB for 3 KB): copied to their size when kept.
            return memoryview(out).tobytes() if held else out
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def passed_on(raw: bytes, doc: Any, mine: bytes | None = None) -> bytes:
    """The bytes a pass-through face sends upstream for a body it parsed
    into `doc`: the client's own, unless they may hold a key twice.

    {"model": "<dear>", "model": "<cheap>"} parses to its last value, and an
    upstream may keep the first: the bytes would run what was neither
    authorised nor billed.  Such a body is sent re-encoded from `doc`, which
    is one truth for the three.  The check is cheap where it can be: a
    body that is already orjson's encoding of `doc` (compact JSON, as Node
    clients send) is equal to it byte for byte; another (spaces, escapes)
    is compared by its count of ':' with that encoding.  Each key has one
    colon outside strings, and a colon inside a string is a colon in both
    unless the client escaped it as \\u003a (orjson never does), which a
    body holding "u003" is taken to have done.  So an equal count in a body
    without "u003" means no key was dropped; anything else (a duplicate, a
    hidden colon) sends the re-encoding.  `mine`: that encoding, when the
    parse made it already."""
    if mine is None:
        mine = dumps(doc, held=False)
    if mine == raw:
        return raw
    if raw.count(b":") == mine.count(b":") and b"u003" not in raw:
        return raw
    return memoryview(mine).tobytes()


def loads_answer(body: bytes | str) -> Any:
    """An upstream's JSON answer (or one event's data), read as the json
    module reads it (what orjson would refuse or round, NaN or a long
    integer, goes to json)."""
    if orjson is not None:
        data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
        if not _long_int(data.translate(_SHAPES)):
            try:
                return orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
    return json.loads(body)


def parse_object(raw: bytes | str, what: str = "The request body") -> dict:
    return _object(parse(raw, what), what)


def _object(doc: Any, what: str) -> dict:
    if not isinstance(doc, dict):
        raise BadInput(f"{what} must be a JSON object.")
    return doc


def _note(refused: list, value):
    if isinstance(value, _Refused):
        refused.append(1)
    return value


def _check(doc, max_depth: int, surrogates: bool):
    """(path, problem) of the first refused value, or None.  Iterative: it
    must not itself recurse on what it is there to refuse."""
    stack = [(doc, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            if max_depth and depth > max_depth:
                return _deep(path, max_depth)
            for k, v in value.items():
                sub = f"{path}.{_name(k)}" if path else _name(k)
                if surrogates and _SURROGATE.search(k):
                    return lone(sub)
                stack.append((v, depth + 1, sub))
        elif isinstance(value, list):
            if max_depth and depth > max_depth:
                return _deep(path, max_depth)
            stack.extend((v, depth + 1, f"{path}[{i}]") for i, v in enumerate(value))
        elif isinstance(value, _Refused):
            return path, f"'{path}' {value.why}." if path else f"{{what}} {value.why}."
        elif surrogates and isinstance(value, str) and _SURROGATE.search(value):
            return lone(path)
    return None


def _not_utf8(raw: bytes, exc: UnicodeDecodeError, what: str, max_depth: int) -> BadInput:
    """Name the field holding the bad bytes when the rest is readable JSON."""
    where = f"byte {exc.start}"
    try:
        doc = json.loads(raw.decode("utf-8", "surrogateescape"))
        found = _check(doc, max_depth, True)
        if found is not None and found[0]:
            return BadInput(f"{what} is not valid UTF-8: '{found[0]}' holds bytes that are not "
                            f"(first at {where}).", found[0])
    except (ValueError, RecursionError):
        pass
    return BadInput(f"{what} is not valid UTF-8 (first bad byte at {where}).")
