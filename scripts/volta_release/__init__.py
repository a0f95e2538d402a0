"""Release tooling for the repository's distributions: what each one is (read from its
``pyproject.toml`` and sources), its changelog's rules, the README's compatibility table and the
checks of built artifacts. ``scripts/build_release.sh`` runs it; ``python -m volta_release --help``
(with ``scripts/`` on ``PYTHONPATH``) lists its commands."""
