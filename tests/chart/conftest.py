"""The Helm chart (charts/effectq), rendered offline through Helm's Go SDK (helm-python-sdk,
no helm binary), once per values variant, and written out the way `helm template` prints
it, for the validators to read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.chart._chart import (
    CHART,
    NAMESPACE,
    RELEASE,
    VARIANTS,
    Render,
    Rendered,
    helm_template,
)
from tests.support.requires import unavailable


@pytest.fixture(scope="session")
def helm() -> ModuleType:
    try:
        import helm_python
    except ImportError as exc:
        unavailable(f"helm-python-sdk is not installed ({exc}; pip install -e '.[chart-test]')")
    return helm_python


@pytest.fixture(scope="session")
def chart(helm: ModuleType) -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: Any) -> Render:
    """render(values) -> Rendered; Helm's errors (schema, `fail`, `required`) propagate."""

    def _render(values: dict[str, Any]) -> Rendered:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        files, notes = helm_template(manifests)
        objects = [o for text in files.values() for o in yaml.safe_load_all(text) if o]
        return Rendered(files, objects, notes)

    return _render


@pytest.fixture(scope="session")
def variants(render: Any) -> dict[str, Rendered]:
    return {name: render(values) for name, values in VARIANTS.items()}


@pytest.fixture(scope="session")
def rendered_dir(variants: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """<dir>/<variant>/<template>.yaml for every variant: what the validators scan."""
    root = tmp_path_factory.mktemp("rendered")
    for name, rendered in variants.items():
        for template, text in rendered.files.items():
            path = root / name / template
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return root
