"""What the hostile tests hold the code to, one line each: a test names its promise with
`@pytest.mark.promise(...)`, and the summary at the end of a run counts, per promise, the
attempts and how many held (tests/conftest.py, pytest_terminal_summary)."""

STORE = "a --db that is no store is refused, untouched"
OUTPUT = "an output never replaces what cs336sys did not write"
INPUT = "bad input is one line, exit 2, nothing written"
READ_ONLY = "reading a store leaves its folder as it was"
WRITERS = "writers at once lose nothing"
SIGNALS = "a signal at any moment ends the command cleanly"
RANKS = "no rank outlives its command"
REPORTS = "a report embeds only what cs336sys wrote"
