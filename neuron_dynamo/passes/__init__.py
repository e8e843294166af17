"""Graph → graph passes over aten FX graphs, each a pure function with its own tests."""
