"""No docstring or comment in ``picker/`` quotes a lab run's results or narrates history: code says what it does
and why; the numbers live in docs/ (docs/performance.md, docs/scheduling.md) with their command and date.

The patterns match what only a run's results or a diary produce (a percentile with a latency, a before → after, a
request count out of a run's total, "worse in the lab", seeds, dated sessions, issue numbers); parameter defaults and
units ("``tolerance`` 0.25", "``placedHalfLifeS`` 60 s", "``--seeds 0,1,2``") do not match them."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "picker"
_NUMBER = r"\d[\d,]*(?:\.\d+)?"
_LATENCY = rf"{_NUMBER}(?:-{_NUMBER})? ?(?:ms|µs|s)\b"
PATTERNS = {
    # "154 ms p90", "p90 TTFT of 80-85 ms", "3.8 → 3.1 s p90"
    "a percentile with a measured latency": re.compile(
        rf"\bp(?:50|90|95|99)\b[^.;:()]{{0,40}}?{_LATENCY}|{_LATENCY}[^.;:()]{{0,12}}\bp(?:50|90|95|99)\b"
    ),
    # "3.9 → 2.5 s", "104 → 135 ms", "0.979x → 0.993x"
    "a before → after": re.compile(rf"{_NUMBER} ?(?:ms|µs|s|%|x)? ?(?:→|->) ?{_NUMBER}"),
    # "took 191 of the ~200 requests", "42 of 1,500 requests", "55 requests in 8 s"
    "a run's request count": re.compile(
        rf"\b{_NUMBER} of (?:the )?(?:next )?~?{_NUMBER} (?:\w+ )?requests\b|\b{_NUMBER} requests in {_NUMBER} ?s\b"
    ),
    # "the lab's numbers", "the lab's slow-server short-long 400 req/s", "made the lab's points worse", "spaced them
    # worse in the lab", "multi-turn 80 req/s ... in the lab" (not "runs in the lab": that says where, not a result)
    "a lab result": re.compile(
        rf"\bthe lab's (?:numbers|points|[\w-]+ [\w-]+ \d)|\blab numbers\b"
        rf"|(?:{_NUMBER}|\b(?:better|worse|helped|hurt|won|lost|cost\w*))[^.;]{{0,60}}?\bin the (?:policy )?lab\b",
        re.I,
    ),
    # "(seeds 0 and 1)", "over seeds 0-2", "seed 0)" -- not the ``--seeds`` flag
    "a seed": re.compile(r"(?<![-\w])seeds? \d"),
    # "Tried in a seventh session of 2026-12-05", "(docs/scheduling.md, issue 13)", "issue 13's bar"
    "history": re.compile(r"\bsession of 20\d\d|\b20\d\d-\d\d-\d\d\b|\bissue \d+|\bwe tried\b|\bused to be\b", re.I),
    # "x better/worse", "cost 5-11 %", "lost 11-18 %"
    "a result won or lost": re.compile(
        rf"{_NUMBER}(?:-{_NUMBER})? ?(?:%|x) (?:better|worse)\b"
        rf"|\b(?:cost|lost|won|gained|saved)\s+{_NUMBER}(?:-{_NUMBER})? ?%(?! of a)"
    ),
}


def _texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring (module, class, function) and every comment of ``path``."""
    source = path.read_text(encoding="utf-8")
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                found.append((node.body[0].lineno, docstring))
    comments: list[tuple[int, str]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        text = token.string.lstrip("#").strip()
        if comments and comments[-1][0] + comments[-1][1].count("\n") == line - 1:  # a block reads as one text
            comments[-1] = (comments[-1][0], f"{comments[-1][1]}\n{text}")
        else:
            comments.append((line, text))
    return found + comments


def findings(path: Path) -> list[str]:
    """Each match of ``PATTERNS`` in ``path``'s docstrings and comments, as ``file:line: kind: text``."""
    out = []
    for line, text in _texts(path):
        flat = " ".join(text.split())  # a phrase may wrap across lines
        for kind, pattern in PATTERNS.items():
            for match in pattern.finditer(flat):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {kind}: ...{match.group(0)}...")
    return out


def test_no_docstring_or_comment_quotes_lab_results() -> None:
    found = [f for path in sorted(PACKAGE.rglob("*.py")) for f in findings(path)]
    assert not found, "lab results or history in the code (move them to docs/ and link):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "the lab's slow-server short-long 400 req/s: 154 ms p90 against least connections' 107; with it 104",
        "multi-turn 80 req/s 3.8 → 3.1 s p90 in the lab",
        "a server 15x slower for 70 s took 191 of the ~200 requests of a 10 s window",
        "a 100x server took 42 of 1,500 requests at 100 req/s, now 2",
        '(docs/scheduling.md, "Tried in a seventh session of 2026-12-05")',
        "live through the real Envoy 96 and 91 ms (seeds 0 and 1)",
        "weighing every prompt cost 5-11 % on multi-turn",
        "would cache them (docs/scheduling.md, issue 13)",
    ],
)
def test_patterns_catch_lab_results(text: str) -> None:
    assert any(p.search(" ".join(text.split())) for p in PATTERNS.values()), text


@pytest.mark.parametrize(
    "text",
    [
        "Parameters: ``tolerance`` 0.25 (≥ 0), ``memorySeconds`` 30 (> 0).",
        "fading with a half-life of ``placedHalfLifeS`` (60 s; ≥ 1 s)",
        "picker bench lab-eval --jobs 2 --cache runs --seeds 0,1,2   # the count on the mean of 3 seeds",
        "It prints p90 TTFT and the prefix-cache hit share, both against one replica",
        "a server answering 2x slower than the pool takes about half its share of them",
        "``timeout_s`` for request and body, 64 KiB for the head; TTFT p50/p90/mean per phase",
        "the same workload, rate and seed give the same requests in the lab (virtual time)",
        "candidate key -> blocks it holds along the walk",
    ],
)
def test_patterns_spare_parameter_docs(text: str) -> None:
    assert not any(p.search(" ".join(text.split())) for p in PATTERNS.values()), text


_SECTION_LINK = re.compile(r'\b(docs/[\w-]+\.md)(?:,| has| says)?\s*\(?"([^"]+)"')


def section_links(path: Path) -> list[tuple[int, str, str]]:
    """(line, doc, section) of every ``docs/X.md, "Section"`` in ``path``'s docstrings and comments."""
    return [(line, *link) for line, text in _texts(path) for link in _SECTION_LINK.findall(" ".join(text.split()))]


def headings(doc: Path) -> list[str]:
    return [line.lstrip("#").strip() for line in doc.read_text(encoding="utf-8").splitlines() if line.startswith("#")]


def test_section_links_name_a_heading() -> None:
    """A section a docstring or comment points to is (the start of) a heading of that doc."""
    links = [(path, *link) for path in sorted(PACKAGE.rglob("*.py")) for link in section_links(path)]
    assert len(links) >= 5  # the pattern reads the links the code has
    broken = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {doc}, {section!r}"
        for path, line, doc, section in links
        if not any(h.startswith(section) for h in headings(PACKAGE.parent / doc))
    ]
    assert not broken, "links to sections that do not exist:\n" + "\n".join(broken)
