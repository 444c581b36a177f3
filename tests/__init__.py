"""The test suite (pytest). A package so that scripts can import tests.support and tests.reference."""
