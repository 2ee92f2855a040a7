"""Writers of XProf-format captures: synthetic designs for tests and examples, modelled captures."""
