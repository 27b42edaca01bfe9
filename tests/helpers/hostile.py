"""Hostile input, as hypothesis strategies shared by the fuzz tests of both fronts (the queue
handler, tests/worker/test_fuzz.py; the HTTP front, tests/worker/test_front_fuzz.py)."""

from __future__ import annotations

from hypothesis import strategies as st

from warmstart.worker.routes import ROUTES

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=30,
)
# Field values inside the shaped inputs: smaller, so that a case costs little to generate.
small_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)

# Unicode look-alikes of the characters routes are made of: fullwidth and other slashes,
# Cyrillic and Greek letters that render like Latin ones, dots, and invisible characters.
LOOKALIKES = {
    "/": ["／", "∕", "⁄", "\\", "%2f", "%2F", "%252f", "//", "/./"],
    ".": ["．", "%2e", "%2E", "。"],
    "o": ["о", "ο", "０", "ｏ"],
    "e": ["е", "ε", "ｅ"],
    "c": ["с", "ｃ"],
    "p": ["р", "ρ"],
    "a": ["а", "α"],
    "i": ["і", "ı"],
    "s": ["ѕ"],
    "v": ["ν", "ѵ"],
    "1": ["１", "l", "I"],
}
INSERTS = [
    "/..",
    "/../sleep",
    "/%2e%2e/sleep",
    "/%2E%2E/collective_rpc",
    "/..%2fsleep",
    "?x=1",
    "?",
    "#frag",
    ";param",
    "%00",
    "\x00",
    "\r\n",
    " ",
    "\t",
    "\u200b",
    "\ufeff",
    "/",
    "//",
    "\\..\\sleep",
    "%20",
    "@evil",
]


@st.composite
def mutated_route(draw: st.DrawFn) -> str:
    """An allowlisted route, changed in one to three ways: encoded, dotted, doubled, suffixed,
    case-changed, look-alike characters, prefixed with a scheme or host."""
    route = draw(st.sampled_from(sorted(ROUTES)))
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["insert", "lookalike", "case", "prefix", "percent", "strip"]))
        if how == "insert":
            at = draw(st.integers(0, len(route)))
            route = route[:at] + draw(st.sampled_from(INSERTS)) + route[at:]
        elif how == "lookalike":
            spots = [i for i, ch in enumerate(route) if ch in LOOKALIKES]
            if spots:
                i = draw(st.sampled_from(spots))
                route = route[:i] + draw(st.sampled_from(LOOKALIKES[route[i]])) + route[i + 1 :]
        elif how == "case":
            route = draw(st.sampled_from([route.upper(), route.title(), route.swapcase(), route.capitalize()]))
        elif how == "prefix":
            route = draw(st.sampled_from(["http://127.0.0.1:9", "//evil", "http:", "file://", ".", "~"])) + route
        elif how == "percent":
            i = draw(st.integers(0, len(route) - 1))
            route = route[:i] + f"%{ord(route[i]):02x}" + route[i + 1 :]
        else:
            route = route.strip("/") if draw(st.booleans()) else route + "/"
    return route


# Bodies that are JSON in all but one way, or legal and costly: NaN/Infinity (Python's json reads
# them, JSON does not), nesting at and past MAX_DEPTH, and many small containers (each costs a parse).
@st.composite
def hostile_json_bodies(draw: st.DrawFn) -> bytes:
    how = draw(st.sampled_from(["constant", "deep", "wide"]))
    if how == "constant":
        constant = draw(st.sampled_from([b"NaN", b"Infinity", b"-Infinity"]))
        return draw(st.sampled_from([b'{"a": %s}', b"[1, %s]", b'{"p": {"q": [%s]}}'])) % constant
    if how == "deep":
        depth = draw(st.integers(60, 70))
        return b'{"prompt": ' + b"[" * depth + b"]" * depth + b"}"
    return b'{"prompt": [' + b",".join([b"[[]]"] * draw(st.integers(1, 5000))) + b"]}"
