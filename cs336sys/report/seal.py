"""The last line of every text document cs336sys writes (a report's or writeup's html, md,
tex and typst files, and their tables' own files): the sha256 of everything above it, in a
comment of the document's language.

A later write replaces a file cs336sys wrote and nobody touched; one whose text no longer
matches its seal was edited since (the answers a student typed into the writeup starter),
and is refused as anything cs336sys did not write is (cli/outputs.py). Files written before
the seal have none and are taken as cs336sys's, as they were.
"""

from __future__ import annotations

import hashlib
import re

# The comment a document's seal sits in, by its suffix's format.
_COMMENT = {"html": "<!-- {} -->", "md": "<!-- {} -->", "tex": "% {}", "typst": "// {}",
            "typ": "// {}"}
# Found whatever an editor did to its line's end (CRLF, the file's last newline removed);
# anything after it but white space is an edit.
_SEAL = re.compile(rb"(?:<!-- |% |// )cs336sys sha256 ([0-9a-f]{64})(?: -->)?")


def sealed(text: str, fmt: str) -> str:
    """`text` with its seal as the last line (`fmt`: html, md, tex, typst or typ)."""
    if not text.endswith("\n"):
        text += "\n"
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return text + _COMMENT[fmt].format(f"cs336sys sha256 {digest}") + "\n"


def edited(data: bytes) -> bool:
    """Whether a document whose bytes are `data` carries a seal that its text above no
    longer matches, or has text after it (an answer appended at the end); one without a
    seal, written before there were any, is not said to be edited."""
    found = next(reversed(list(_SEAL.finditer(data))), None)  # the last one
    if found is None:
        return False
    if data[found.end():].strip():
        return True
    return hashlib.sha256(data[:found.start()]).hexdigest() != found.group(1).decode()
