"""Token generation with a small DeepSeek-shaped MLA stack on mla_ext (python3 -m examples.demo.demo)."""
