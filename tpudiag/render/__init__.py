"""One module per output format. Renderers format the report object; they compute nothing."""
