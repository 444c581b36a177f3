"""Examples of using mla_ext; run from the repository root, e.g. python3 -m examples.demo.demo."""
