"""The course's basics package: a Transformer LM (assignment 1's staff solution, in spirit)."""
