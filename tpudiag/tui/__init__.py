"""The interactive terminal UI (`tpudiag tui`). Textual is imported only by the modules that draw;
`session`, `keys` and `export` are plain Python so they can be tested and reused without it.
"""
