"""Writers of files: XProf-format captures (synthetic designs for tests and examples, modelled
captures) and, in `files`, the one safe way any command writes an output file (never into an input,
atomic, `-` for stdout)."""
