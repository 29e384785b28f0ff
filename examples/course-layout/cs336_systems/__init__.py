"""A student's systems code, as the course has them write it (a plain example)."""
