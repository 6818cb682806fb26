"""Documents the analyzer's docstrings and comments cite are in the repository: a reader of the code
has the repository, not the notes it was written from (a `FORMATS.md` that lives elsewhere is no
reference).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "analyzer"
_CITED = re.compile(r"(?<![\w./-])((?:[\w-]+/)*[\w-]+\.md)\b")



def citations(text: str) -> set[str]:
    return set(_CITED.findall(text))


def in_repository(document: str) -> bool:
    """A cited document exists at that path from the root, or as that name anywhere in the tree."""
    if (ROOT / document).is_file():
        return True
    name = Path(document).name
    return any(p.is_file() for p in ROOT.glob(f"**/{name}") if ".git" not in p.parts)


def missing_citations() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for document in citations(path.read_text(encoding="utf-8")):
            if not in_repository(document):
                found.add((str(path.relative_to(ROOT)), document))
    return found


def test_the_citation_reader_finds_document_names():
    text = "see FORMATS.md section 5 and docs/ARCHITECTURE.md; not a.mdx, nor x.md5"
    assert citations(text) == {"FORMATS.md", "docs/ARCHITECTURE.md"}
    assert in_repository("docs/ARCHITECTURE.md") and in_repository("README.md")
    assert not in_repository("NO-SUCH-NOTES.md")


def test_every_cited_document_is_in_the_repository():
    assert missing_citations() == set()
