"""The HTTP surface: Litestar app, controllers per audience, auth guards, problem+json."""
