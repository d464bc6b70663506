"""Root conftest: make torchvision importable on CPU torch (before anything imports timm), then
load the kpca-claims plugin (options, parametrisation, results.json): fixtures/plugin/__init__.py."""

import fixtures  # noqa: F401  (applies fixtures.torchvision_compat first)

pytest_plugins = ["fixtures.plugin"]
