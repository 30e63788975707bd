"""What the tests share: tokens, databases, servers, and each area's flows and checkers.

Fixtures stay in tests/conftest.py; everything a test imports by name lives here
(`from support.auth import auth`), on the path through `pythonpath` in pyproject.toml.
"""
