"""The most a call can cost: what is reserved before it runs.

A reservation is an upper bound of the charge, so that no call spends past
the balance (a call whose bound is above it is refused with 403 before
anything is sent) and `unpaid` stays 0 for a limited key or an account
without a credit limit.  The bound is
    input   the client's body in bytes (a byte-level BPE token is at least a
            byte; base64 media count by their bytes), plus a fixed number of
            tokens for each file or image given by reference (URL, file id)
            and for tool definitions (vendors add a system prompt for
            them), but never more than the model's context window;
    output  max_tokens (or the face's own name for it), else the model's
            documented output limit (relay/money/price_catalogue.py), else
            the setting `default_max_tokens`; times the choices asked for
            (`n`, `candidateCount`);
priced at the dearest component of each side (a cache write, audio or
image input; reasoning, audio or image output), at the prompt-size tier the
input bound falls in, times the group rate.  Faces that know their own
bound say so in call.extra: "reserve_output" (legacy completions: max_tokens
x max(n, best_of) x prompts) and "units" (images, characters, seconds).

Cost: the size of the body is its length; only the list contents of the
canonical messages (images, files) are looked into, or what the face noted
from its native body (call.extra "references", "output_asked"), so that a
call passed through is never converted to be bounded.
"""
from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from models.records import Price
from relay.money import pricing
from relay.money import price_catalogue

CHAT_LIKE = ("chat", "responses", "responses_compact")
# No model writes more than this; a bigger max_tokens (1e20) is the
# upstream's to refuse, not a reservation to overflow.
MAX_RESERVED_OUTPUT = 10_000_000
# Tokens reserved for a file or image the upstream fetches by reference: a
# high-detail image is at most about 6,000 (OpenAI's patch models), a PDF
# page about 3,000.
REFERENCE_TOKENS = 16_384
# What vendors add to the prompt when tools are offered (Anthropic's tool
# system prompt is 300-700 tokens).
TOOLS_TOKENS = 1_024
# An unknown context window is taken to be this large.
MAX_CONTEXT = 2_000_000
# Calls of a vendor-run tool reserved when the request sets no limit
# (Anthropic's max_uses, the Responses API's max_tool_calls), and the input
# tokens each may bring back (search results are billed as input).
RESERVED_TOOL_CALLS = 8
TOOL_CALL_TOKENS = 8_192


_INPUT_PARTS = ("input_price", "cache_write_price", "cache_write_1h_price", "audio_input_price",
                "image_input_price")
_OUTPUT_PARTS = ("output_price", "reasoning_price", "audio_output_price", "image_output_price")


def dearest(price: Price, prompt_tokens: int) -> Price:
    """The price at the tier a prompt of this size falls in, with input
    and output at the dearest input and output parts: what bounds any mix
    of parts (the bound's usage has no cached or detailed parts, so those
    prices are never read).  Memoised by the price object: the catalogue's
    and an administrator's are kept, so this is a dict lookup a call."""
    p = price.at(prompt_tokens) if price.tiers else price
    hit = _dearest.get(id(p))
    if hit is not None and hit[0] is p:
        return hit[1]
    inp = max(getattr(p, f) for f in _INPUT_PARTS)
    out = max(getattr(p, f) for f in _OUTPUT_PARTS)
    worst = p if inp == p.input_price and out == p.output_price else \
        replace(p, input_price=inp, output_price=out, tiers=())
    if len(_dearest) > 4096:
        _dearest.clear()
    _dearest[id(p)] = (p, worst)
    return worst


_dearest: dict = {}


def body_bytes(call) -> bytes:
    """The client's body as it will be sent (or as it came)."""
    return call.raw or b""


def prompt_bound(call, channel, tools=None) -> int:
    """Input tokens the call can be billed at most (see the module doc)."""
    if "reserve_prompt" in call.extra:  # a face that knows better (uploads)
        return min(int(call.extra["reserve_prompt"]), context_window(call, channel))
    if tools is None:
        tools = hosted_tools(call)
    raw = body_bytes(call)
    n = len(raw) if raw else _json_size(call)
    if call.endpoint in CHAT_LIKE:
        # A face whose canonical body is made only when read (Call.canonical)
        # counts the references on its native body itself.
        refs = call.extra.get("references")
        if refs is None:
            refs = references(call.body.get("messages")) + int(
                call.extra.get("native_references") or 0)
        n += REFERENCE_TOKENS * refs
        native = call.native_body
        if (native if isinstance(native, dict) else call.body).get("tools"):
            n += TOOLS_TOKENS
    # A conversation continued from a response the upstream keeps.
    n += int(call.extra.get("context_tokens") or 0)
    n += TOOL_CALL_TOKENS * sum(count for count, _ in tools)
    window = context_window(call, channel)
    return min(n, window)


def hosted_tools(call) -> list[tuple[int, str]]:
    """(most calls, price component) of each tool the vendor runs for this
    call: OpenAI's web and file search and code interpreter (Responses; chat's
    web_search_options), Anthropic's web search and code execution, Gemini's
    Google Search grounding."""
    if call.endpoint not in CHAT_LIKE:
        return []
    native = call.native_body if isinstance(call.native_body, dict) else call.body
    out = []
    if call.face == "openai" and isinstance(native.get("web_search_options"), dict):
        out.append((1, "web_search_price"))
    tools = native.get("tools")
    if not isinstance(tools, list):
        return out
    if call.face == "responses":
        kinds = {t.get("type") for t in tools if isinstance(t, dict)}
        found = [c for k, c in (("web_search", "web_search_price"),
                                ("file_search", "file_search_price"),
                                ("code_interpreter", "code_execution_price"))
                 if any(isinstance(x, str) and x.startswith(k) for x in kinds)]
        cap = native.get("max_tool_calls")
        n = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 \
            else RESERVED_TOOL_CALLS
        out += [(n, c) for c in found]   # each kind may take them all
    elif call.face == "anthropic":
        for t in tools:
            kind = str(t.get("type") or "") if isinstance(t, dict) else ""
            cap = t.get("max_uses") if isinstance(t, dict) else None
            n = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0 \
                else RESERVED_TOOL_CALLS
            if kind.startswith("web_search"):
                out.append((n, "web_search_price"))
            elif kind.startswith("code_execution"):
                out.append((n, "code_execution_price"))
    elif call.face == "gemini":
        if any(isinstance(t, dict) and ({"googleSearch", "google_search", "googleSearchRetrieval",
                                         "google_search_retrieval"} & set(t)) for t in tools):
            out.append((RESERVED_TOOL_CALLS * asked_choices(call), "web_search_price"))
    return out


def references(messages) -> int:
    """Files and images in canonical chat messages that the upstream fetches
    by reference (a URL that is not a data: URL, a file id): their size is
    not in the body.  Messages whose content is text are passed over at
    the cost of a type check.  What the conversion to the canonical shape
    drops (an Anthropic file id, a Responses file id), the face counts in
    call.extra["native_references"]."""
    n = 0
    for msg in messages if isinstance(messages, list) else ():
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                n += isinstance(url, str) and not url.startswith("data:")
            elif kind == "file":
                f = part.get("file") if isinstance(part.get("file"), dict) else {}
                n += bool(f.get("file_id") or f.get("file_url"))
    return n


def _json_size(call) -> int:
    from relay.serving import jsonin  # the body was changed after parsing (resolved items)
    doc = call.extra.get("upstream_doc") or call.native_body or call.body
    try:
        return len(jsonin.dumps(doc, held=False))
    except (TypeError, ValueError):
        return MAX_CONTEXT


def context_window(call, channel) -> int:
    window, _ = price_catalogue.limits(channel.type, channel.upstream_model(call.model))
    if window and "context-1m" in str(call.extra.get("anthropic_beta") or ""):
        window = max(window, 1_000_000)
    return window or MAX_CONTEXT


def output_bound(call, channel, default: int) -> int:
    """Output tokens the call can be billed at most (chat-like calls)."""
    if "output_asked" in call.extra:  # noted from the native body by its face
        asked, n = call.extra["output_asked"], asked_choices(call)
    else:
        b = call.body
        asked, n = b.get("max_completion_tokens") or b.get("max_tokens"), choices(b)
    _, limit = price_catalogue.limits(channel.type, channel.upstream_model(call.model))
    if channel.type == "anthropic" and not asked:
        # Anthropic requires one: the adaptor sends the channel's default.
        asked = (channel.options or {}).get("default_max_tokens") or 4096
    try:
        out = min(max(int(asked), 1), MAX_RESERVED_OUTPUT) if asked else (limit or default)
    except (TypeError, ValueError, OverflowError):
        out = limit or default
    if limit:
        out = min(out, limit)  # more is refused upstream, and refused calls cost nothing
    return out * n


def asked_choices(call) -> int:
    """choices() of a chat call, from what its face noted when it defers
    the canonical body (Call.canonical)."""
    if "output_asked" in call.extra:
        return choices({"n": call.extra.get("choices_asked")})
    return choices(call.body)


def choices(body: dict) -> int:
    """How many answers a chat call asks for (n; Gemini's candidateCount
    arrives as n).  The faces refuse values outside the vendors' bounds."""
    n = body.get("n")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 1 else 1


def worst_case(call, channel, price: Price, rate: Decimal, per_call: bool,
               default_output: int) -> int:
    """Quota units the call can cost at most on this channel."""
    units = int(call.extra.get("reserve_units", call.extra.get("units", 1)))
    tools = hosted_tools(call)
    # Rounded apart from the rest: one unit more covers the two roundings.
    extra = pricing.to_units(sum((getattr(price, c) * n for n, c in tools), Decimal(0))
                             * rate) + 1 if tools else 0
    if per_call and price.call_price or (price.call_price and not (
            price.input_price or price.output_price or price.unit_price)):
        return pricing.call_cost(price, rate, max(units, 1)) + extra
    prompt = prompt_bound(call, channel, tools)
    if call.endpoint in CHAT_LIKE:
        out = output_bound(call, channel, default_output)
    else:
        out = int(call.extra.get("reserve_output", 0))
    usage = pricing.Usage(prompt, out, 0, units)
    return pricing.cost(usage, dearest(price, prompt), rate, per_call) + extra
